"""``{% scaling_events deployment %}``: the autoscaler's latest decisions, kept live, for the
deployment page (its view knows nothing of autoscaling)."""

from __future__ import annotations

from typing import Any

from django import template

from console.autoscaling.models import ScalingDecision
from console.autoscaling.scaling_messages import decision_data
from console.deployments.models import Deployment

register = template.Library()

EVENTS_SHOWN = 10


@register.inclusion_tag("autoscaling/_events.html")
def scaling_events(deployment: Deployment) -> dict[str, Any]:
    decisions = ScalingDecision.objects.filter(deployment=deployment)[:EVENTS_SHOWN]
    return {"deployment": deployment, "limit": EVENTS_SHOWN,
            "data": {"decisions": [decision_data(d) for d in decisions]}}
