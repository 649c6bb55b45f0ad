"""Operations on deployments shared by the web views and the API."""

from __future__ import annotations

from console.deployments.models import Deployment


def request_state(deployment: Deployment, desired: str) -> Deployment:
    """Record what the operator wants; the supervisor makes it so on its next tick."""
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=desired)
    deployment.refresh_from_db()
    return deployment
