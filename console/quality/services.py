"""The output gate's rules: when it runs, against what, and what its verdict does to traffic.

A start queues a gate (``on_start``) when the plan wants one; the supervisor runs it once every
worker is ready (``console/quality/gates.py``) and keeps the router stopped while
``router_hold`` names a reason: the start's gate has not finished, or the last gate failed and
the plan's action is ``block``.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Case, When
from django.utils import timezone

from console.audit.entries import record
from console.catalog.models import Variant
from console.checks.kv import dtypes, geometry
from console.checks.nixl import handshake_compat_enforced
from console.checks.plan import PlanView
from console.deployments.models import Deployment, WorkerPlan
from console.quality.models import GateResult
from inference.output_gate import Thresholds

Mode = Deployment.GateMode
State = GateResult.State


class GateRefused(Exception):
    """An on-demand gate that cannot run now; the message says why."""


def gate_applies(deployment: Deployment) -> tuple[bool, str]:
    """Whether a start runs the gate, and the reason in words (the plan page shows it)."""
    workers = list(deployment.workers.all())
    variants = {w.variant for w in workers}
    if deployment.gate_mode == Mode.OFF:
        return False, "off: the plan turns it off"
    if deployment.gate_mode == Mode.ON:
        return True, "on: the plan turns it on"
    quantized = sorted(str(v) for v in variants if v.is_quantized)
    if len(variants) > 1:
        return True, ("on (auto): the workers use different variants "
                      f"({', '.join(sorted(str(v) for v in variants))})")
    if quantized:
        return True, f"on (auto): the workers use a quantized variant ({quantized[0]})"
    return False, "off (auto): every worker uses the same unquantized variant"


def reference_variant(deployment: Deployment) -> Variant | None:
    """The full-precision reference: the base model's unquantized variant named ``bf16``, else
    its first registered unquantized one. Not simply an unquantized variant a worker uses: that
    may be a different (or damaged) checkpoint, which is what the gate is there to catch."""
    return original_variant(deployment.base_model_id)


def original_variant(base_id: int) -> Variant | None:
    return (Variant.objects.filter(base=base_id, quantization="")
            .order_by(Case(When(name="bf16", then=0), default=1), "pk").first())


def candidates(deployment: Deployment) -> dict[str, str]:
    """The workers the gate scores: the first of each role and variant, label -> URL."""
    picked: dict[tuple[str, int], WorkerPlan] = {}
    for worker in deployment.workers.select_related("variant").order_by("role", "index"):
        picked.setdefault((worker.role, worker.variant_id), worker)
    return {f"{w.slot} ({w.variant.name})": w.url for w in picked.values()}


def thresholds(gate: GateResult) -> Thresholds:
    return Thresholds(min_agreement=gate.min_agreement, max_mean_delta=gate.max_mean_delta)


def latest_gate(deployment: Deployment) -> GateResult | None:
    return deployment.gate_results.order_by("-created", "-pk").first()


@transaction.atomic
def queue_gate(deployment: Deployment, trigger: str) -> GateResult:
    """A new gate run with the plan's settings; a queued one it replaces is cancelled."""
    deployment.gate_results.filter(state=State.QUEUED).update(
        state=State.CANCELLED, error="replaced by a newer gate run", finished_at=timezone.now())
    return GateResult.objects.create(
        deployment=deployment, trigger=trigger, prompts=deployment.gate_prompts,
        min_agreement=deployment.gate_min_agreement, max_mean_delta=deployment.gate_max_mean_delta,
        action=deployment.gate_action,
    )


def on_start(deployment: Deployment) -> GateResult | None:
    """Called by every start: queue the gate that holds the router, when the plan wants one."""
    applies, _ = gate_applies(deployment)
    return queue_gate(deployment, GateResult.Trigger.START) if applies else None


@transaction.atomic
def request_gate(deployment: Deployment) -> GateResult:
    """The gate on demand (button, API): it scores the running workers; traffic flows meanwhile."""
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        raise GateRefused("the deployment is not running: the gate scores its running workers")
    if deployment.gate_results.filter(state__in=(State.QUEUED, State.RUNNING)).exists():
        raise GateRefused("a gate run is already queued or running")
    if reference_variant(deployment) is None:
        raise GateRefused(f"{deployment.base_model.name} has no unquantized variant to use as "
                          "the reference; register one")
    gate = queue_gate(deployment, GateResult.Trigger.DEMAND)
    record("gate.run", gate, team_id=deployment.team_id, after={
        "deployment": deployment.name, "prompts": gate.prompts,
        "min_agreement": gate.min_agreement, "max_mean_delta": gate.max_mean_delta,
        "action": gate.action})
    return gate


def router_hold(deployment: Deployment, gate: GateResult | None = None) -> str:
    """Why the router must not serve now, or "" when it may."""
    gate = gate or latest_gate(deployment)
    if gate is not None and not gate.done:
        if gate.trigger == GateResult.Trigger.START:
            return "waiting for the output gate"
        # A run on demand changes nothing until it is done: the last verdict stands meanwhile.
        gate = deployment.gate_results.filter(
            state__in=(State.PASSED, State.FAILED, State.ERROR)).order_by("-created", "-pk").first()
    if gate is None:
        return ""
    if (gate.state in (State.FAILED, State.ERROR) and deployment.gate_action == Deployment.GateAction.BLOCK
            and gate_applies(deployment)[0]):
        what = "failed" if gate.state == State.FAILED else "could not run"
        detail = "; ".join(gate.reasons) or gate.error
        return f"output gate {what}: {detail}"
    return ""


def variants_note(deployment: Deployment) -> str:
    """What a plan with different variants per role means for the KV hand-off, in words."""
    plan = PlanView.workers_only(deployment)
    by_role: dict[str, set[str]] = {}
    for worker in plan.workers:
        by_role.setdefault(worker.role, set()).add(f"{worker.variant.name}"
                                                   + (f" ({worker.variant.quantization})"
                                                      if worker.variant.quantization else ""))
    if len({w.variant_id for w in plan.workers}) < 2:
        return ""
    sides = "; ".join(f"{role} runs {', '.join(sorted(names))}" for role, names in by_role.items())
    if plan.uninspected():
        return f"{sides}. Whether their KV caches match is known once every variant is inspected."
    if geometry(plan)[0] > 1 or dtypes(plan)[0] > 1:
        return (f"{sides}. Their KV caches differ (see kv.geometry and kv.dtype): prefill's KV "
                "cannot be read by decode, so the plan cannot start.")
    same = (f"{sides}: variants of {deployment.base_model.name} with the same KV geometry and KV "
            "cache dtype (kv.geometry and kv.dtype pass).")
    if deployment.kv_channel == "nixl":
        if handshake_compat_enforced(plan):
            return f"{same} NIXL's handshake check stays on (see nixl.compat)."
        return (f"{same} NIXL's handshake compares a hash that includes the model path, which "
                "differs between the variants, so pdserve switches NIXL's compatibility check off "
                "on the workers (enforce_handshake_compat: false) — only because those checks "
                "passed.")
    return (f"{same} The {deployment.kv_channel} channel matches KV by prompt tokens, so there is "
            "no handshake to switch off; with NIXL pdserve would switch its model-path check off.")
