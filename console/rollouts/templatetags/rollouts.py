"""``{% revision_summary deployment %}``: the live revision and any rollout in progress, for the
deployment page (its view knows nothing of rollouts)."""

from __future__ import annotations

from typing import Any

from django import template

from console.deployments.models import Deployment
from console.rollouts import revisions, services

register = template.Library()


@register.inclusion_tag("rollouts/_summary.html")
def revision_summary(deployment: Deployment) -> dict[str, Any]:
    return {"deployment": deployment, "live_number": revisions.live_number(deployment),
            "active": services.active(deployment)}
