"""Advice per role on the plan page: each variant of the base model, its measured speed on the
role's node (prefill tokens/s for prefill, decode tokens/s for decode) and its gate against the
base; the fastest variant that passes the plan's thresholds is recommended."""

from __future__ import annotations

from dataclasses import dataclass

from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.quality.models import VariantMeasurement

SPEED_OF_ROLE = {"prefill": "prefill_tps", "decode": "decode_tps", "colocated": "decode_tps"}


@dataclass(frozen=True)
class VariantAdvice:
    variant: Variant
    measurement: VariantMeasurement | None  # the latest finished one on the node
    pending: VariantMeasurement | None  # queued or running now
    speed: float | None
    passes: bool | None  # None: not measured
    in_use: bool
    recommended: bool = False


@dataclass(frozen=True)
class RoleAdvice:
    role: str
    node: Node
    unit: str
    rows: list[VariantAdvice]

    @property
    def recommended(self) -> VariantAdvice | None:
        return next((row for row in self.rows if row.recommended), None)


def passes(deployment: Deployment, measurement: VariantMeasurement) -> bool:
    agreement, delta = measurement.agreement, measurement.mean_delta
    return (agreement is not None and delta is not None
            and agreement >= deployment.gate_min_agreement
            and delta <= deployment.gate_max_mean_delta)


def advice(deployment: Deployment) -> list[RoleAdvice]:
    variants = list(Variant.objects.filter(base=deployment.base_model_id).order_by("name"))
    roles: dict[str, tuple[Node, set[int]]] = {}
    for worker in deployment.workers.select_related("node").order_by("role", "index"):
        node, used = roles.setdefault(worker.role, (worker.node, set()))
        used.add(worker.variant_id)
    measurements = list(VariantMeasurement.objects.filter(
        variant__in=variants, node__in={node for node, _ in roles.values()}))
    result = []
    for role, (node, used) in roles.items():
        field = SPEED_OF_ROLE[role]
        rows = []
        for variant in variants:
            on_node = [m for m in measurements if m.variant_id == variant.pk and m.node_id == node.pk]
            done = next((m for m in on_node if m.state == VariantMeasurement.State.DONE), None)
            pending = next((m for m in on_node if m.state in (VariantMeasurement.State.QUEUED,
                                                               VariantMeasurement.State.RUNNING)), None)
            rows.append(VariantAdvice(
                variant=variant, measurement=done, pending=pending,
                speed=getattr(done, field) if done else None,
                passes=passes(deployment, done) if done else None, in_use=variant.pk in used))
        best = max((r for r in rows if r.passes and r.speed is not None),
                   key=lambda r: r.speed or 0.0, default=None)
        rows = [VariantAdvice(**{**r.__dict__, "recommended": r is best}) for r in rows]
        result.append(RoleAdvice(role, node, "prompt tokens/s" if role == "prefill"
                                 else "generated tokens/s, one stream", rows))
    return result
