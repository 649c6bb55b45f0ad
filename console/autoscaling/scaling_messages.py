"""What the autoscaler sends over a deployment's socket (group ``deployment-<id>``): each stored
or extended decision, for the autoscaling page and the deployment page's events list, and each
pool reading, for the page's chart.

With Redis the autoscaler sends them as it stores them; in the embedded mode the console's hub
polls the stored rows (console/autoscaling/scaling_socket.py)."""

from __future__ import annotations

from typing import Any

from console.autoscaling.models import PoolReading, ScalingDecision

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


def reading_message(reading: PoolReading) -> dict[str, Any]:
    """One evaluation of a pool, stored or not acted on: the page charts the signal."""
    return {"type": READING_TYPE, "deployment": reading.deployment_id,
            "reading": reading_data(reading)}


def reading_data(reading: PoolReading) -> dict[str, Any]:
    return {"role": reading.role, "at": reading.at.isoformat(), "value": reading.value,
            "asked": reading.asked, "current": reading.current, "ready": reading.ready,
            "scale_up_at": reading.scale_up_at, "scale_down_at": reading.scale_down_at,
            "mode": reading.mode}
