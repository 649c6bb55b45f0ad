"""The advice for a deployment: every topology its node's devices allow, simulated against the
newest measured speeds of its variant there (inference/advisor), ranked by goodput under the
plan's TTFT and TPOT SLOs, with the current plan among them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from console.advisor.load_sources import Load
from console.advisor.models import SpeedProfile
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.fleet.services import local_node
from inference.advisor.candidates import Ranked, rank
from inference.advisor.errors import InputError
from inference.advisor.goodput import PERCENTILES, Slo
from inference.advisor.simulate import Topology
from inference.advisor.speeds import speeds_from_json

SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Subject:
    """What is advised on: the plan's node and variant, and its topology now."""

    node: Node
    variant: Variant
    current: Topology
    devices: int


def subject(deployment: Deployment) -> Subject | None:
    """None for a plan without workers. The decode (or colocated) variant is the one measured:
    the simulator charges every server the same speeds."""
    workers = list(deployment.workers.select_related("node", "variant"))
    if not workers:
        return None
    counts = {role: sum(1 for w in workers if w.role == role)
              for role in ("colocated", "prefill", "decode")}
    current = (Topology(colocated=counts["colocated"]) if counts["colocated"]
               else Topology(prefill=counts["prefill"], decode=counts["decode"]))
    measured = next((w for w in workers if w.role in ("decode", "colocated")), workers[0])
    node = measured.node or local_node()
    gpus = node.gpus.count()
    return Subject(node, measured.variant, current, gpus or node.cpu_count)


def newest_speeds(node: Node, variant: Variant) -> SpeedProfile | None:
    return SpeedProfile.objects.filter(node=node, variant=variant,
                                       state=SpeedProfile.State.DONE).first()


def candidate(ranked: Ranked, seeds: int, current: Topology) -> dict[str, Any]:
    s = ranked.summary
    names = [f"p{p}" for p in PERCENTILES]
    return {
        "topology": ranked.topology.label,
        "mode": "colocated" if ranked.topology.colocated else "pd",
        "servers": {"colocated": ranked.topology.colocated, "prefill": ranked.topology.prefill,
                    "decode": ranked.topology.decode},
        "current": ranked.topology == current,
        "goodput_rps": round(s.goodput_rps, 4),
        "slo_attained": round(s.attained, 4),
        "ttft_ms": dict(zip(names, (round(v, 1) for v in s.ttft_ms), strict=True)),
        "tpot_ms": dict(zip(names, (round(v, 1) for v in s.tpot_ms), strict=True)),
        # Confidence: in how many of the drawn workloads it had the highest goodput, and its
        # goodput's range over them (inference/advisor/candidates.py).
        "confidence": {"best_in": ranked.best_in, "seeds": seeds,
                       "goodput_min_rps": round(min(ranked.goodput_by_seed), 4),
                       "goodput_max_rps": round(max(ranked.goodput_by_seed), 4)},
    }


def advise(deployment: Deployment, load_of: Callable[[], Load]) -> dict[str, Any]:
    """The advice as the API and the page show it. Without measured speeds it says so and
    names the measurement to make, before the load is built (a deployment never measured has
    often served nothing to build a load from). ``load_of`` may raise
    load_sources.LoadUnavailable."""
    found = subject(deployment)
    base: dict[str, Any] = {"deployment": deployment.pk, "load": "",
                            "slo": {"ttft_ms": deployment.ttft_slo_ms,
                                    "tpot_ms": deployment.tpot_slo_ms}}
    if found is None:
        return {**base, "status": "no_plan", "detail": "the plan has no workers", "candidates": []}
    base.update(node=found.node.name, variant=str(found.variant), devices=found.devices,
                current=found.current.label)
    profile = newest_speeds(found.node, found.variant)
    if profile is None:
        return {**base, "status": "not_measured", "candidates": [],
                "detail": f"no speeds of {found.variant} on {found.node.name} are measured yet",
                "measure": {"node": found.node.pk, "variant": found.variant.pk}}
    load = load_of()
    base["load"] = load.description
    try:
        speeds = speeds_from_json(profile.speeds)
        ranked = rank(load.profile, speeds, Slo(deployment.ttft_slo_ms, deployment.tpot_slo_ms),
                      found.devices, SEEDS)
    except InputError as exc:
        return {**base, "status": "unusable", "candidates": [], "measured": profile.pk,
                "detail": f"speeds #{profile.pk} cannot be simulated: {exc}"}
    rows = [candidate(r, len(SEEDS), found.current) for r in ranked]
    best = rows[0]
    return {**base, "status": "advised", "measured": profile.pk, "candidates": rows,
            "recommended": best["topology"], "switch": not best["current"],
            "slo_attained_enough": best["slo_attained"] >= 0.9}
