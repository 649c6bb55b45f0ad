"""``{% verification_panel deployment %}``: the deployment page's "Verify now" button and its
latest reports (the page's view, in the control app, knows nothing of verifications)."""

from __future__ import annotations

from typing import Any

from django import template

from console.deployments.models import Deployment

register = template.Library()
SHOWN = 5


@register.inclusion_tag("verification/_deployment.html", takes_context=True)
def verification_panel(context: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
    return {"deployment": deployment, "can_operate": context.get("can_operate", False),
            "csrf_token": context.get("csrf_token"),
            "verifications": list(deployment.verifications.all()[:SHOWN])}
