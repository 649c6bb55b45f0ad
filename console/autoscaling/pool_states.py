"""Each pool of a deployment as the autoscaling page and API show it: its count in the plan,
how many of those are ready, its policy and the latest decision."""

from __future__ import annotations

from typing import Any

from console.autoscaling.models import PoolPolicy, ScalingDecision
from console.autoscaling.services import pool_roles
from console.deployments.models import Deployment
from console.supervisor.models import ManagedProcess


def pool_states(deployment: Deployment) -> list[dict[str, Any]]:
    policies = {p.role: p for p in PoolPolicy.objects.filter(deployment=deployment)}
    ready_slots = set(ManagedProcess.objects.filter(
        deployment=deployment, state=ManagedProcess.State.READY).values_list("slot", flat=True))
    states = []
    for role in pool_roles(deployment):
        slots = [w.slot for w in deployment.workers.filter(role=role)]
        latest = (ScalingDecision.objects.filter(deployment=deployment, role=role)
                  .order_by("-at", "-pk").first())
        states.append({
            "role": role, "current": len(slots),
            "ready": sum(1 for slot in slots if slot in ready_slots),
            "desired": latest.desired if latest is not None else None,
            "policy": policies.get(role), "latest": latest,
        })
    return states
