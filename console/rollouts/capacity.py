"""Whether a second copy fits: blue's workers, green's beside them, and the other deployments'
on the same nodes, against each node's memory as the memory.fit check counts it. Blue-green
and canary need the room; the in-place strategy is what a box that cannot hold two copies
gets."""

from __future__ import annotations

from typing import Any

from console.checks.memory import estimate, node_fit
from console.checks.plan import PlanView
from console.deployments.models import Deployment
from console.rollouts import revisions


def second_copy_fits(deployment: Deployment, spec: dict[str, Any]) -> tuple[bool, str]:
    """Whether green beside blue fits every node they share, and the arithmetic in words."""
    plan = PlanView.load(deployment)
    if plan.uninspected():
        return True, "not estimated: a variant is not inspected"
    green = revisions.shadow_workers(deployment, spec)
    own = ([estimate(deployment, w) for w in plan.workers]
           + [estimate(w.deployment, w) for w in green])
    others = [estimate(w.deployment, w) for w in plan.neighbours]
    fits, lines = True, []
    for node in {w.node_id: w.node for w in [*plan.workers, *green]}.values():
        finding, line = node_fit(node, [e for e in own if e.worker.node_id == node.pk],
                                 [e for e in others if e.worker.node_id == node.pk])
        fits = fits and finding is None
        lines.append(line)
    return fits, "; ".join(lines)
