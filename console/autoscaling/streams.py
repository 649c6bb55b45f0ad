"""What the autoscaler sends over a deployment's socket: each stored or extended decision, for
the autoscaling page and the deployment page's events list."""

from __future__ import annotations

from typing import Any

from console.autoscaling.models import ScalingDecision

MESSAGE_TYPE = "scaling.decision"
READING_TYPE = "scaling.reading"


def decision_data(decision: ScalingDecision) -> dict[str, Any]:
    return {
        "id": decision.pk, "role": decision.role, "at": decision.at.isoformat(),
        "last_at": decision.last_at.isoformat(), "evaluations": decision.evaluations,
        "signal": decision.signal, "value": decision.value, "inputs": decision.inputs,
        "current": decision.current, "desired": decision.desired, "target": decision.target,
        "action": decision.action, "reason": decision.reason, "detail": decision.detail,
        "dry_run": decision.dry_run, "slots": decision.slots, "progress": decision.progress,
    }


def decision_message(decision: ScalingDecision) -> dict[str, Any]:
    return {"type": MESSAGE_TYPE, "deployment": decision.deployment_id,
            "decision": decision_data(decision)}


def reading_message(deployment_id: int, role: str, at: float, value: float | None,
                    asked: int | None, current: int, ready: int, scale_up_at: float,
                    scale_down_at: float, mode: str) -> dict[str, Any]:
    """One evaluation of a pool, stored or not: the page charts the signal from these."""
    return {"type": READING_TYPE, "deployment": deployment_id, "role": role, "at": at,
            "value": value, "asked": asked, "current": current, "ready": ready,
            "scale_up_at": scale_up_at, "scale_down_at": scale_down_at, "mode": mode}
