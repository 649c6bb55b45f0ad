"""What the management commands take on their command line: a deployment by name or id."""

from __future__ import annotations

from django.core.management.base import CommandError

from console.deployments.models import Deployment


def named_deployment(value: str) -> Deployment:
    """The deployment named ``value`` (or with that id); CommandError naming DEPLOYMENT."""
    found = Deployment.objects.filter(name=value).first()
    if found is None and value.isdigit():
        found = Deployment.objects.filter(pk=int(value)).first()
    if found is None:
        raise CommandError(f"DEPLOYMENT: no deployment {value!r}")
    return found
