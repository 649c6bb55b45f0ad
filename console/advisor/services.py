"""The advice with its measurement's state: what the API and the page show."""

from __future__ import annotations

from typing import Any

from console.advisor.forms import LoadForm
from console.advisor.load_sources import LoadUnavailable
from console.advisor.models import SpeedProfile
from console.advisor.predictions import advise, subject
from console.deployments.models import Deployment


def latest_measurement(deployment: Deployment) -> SpeedProfile | None:
    found = subject(deployment)
    if found is None:
        return None
    return SpeedProfile.objects.filter(node=found.node, variant=found.variant).select_related(
        "node", "variant").first()


def advice_for(deployment: Deployment, form: LoadForm) -> dict[str, Any]:
    """The advice for a valid ``form``'s load. Raises LoadUnavailable (naming the field) when
    the recorded window holds too little to build a load from and speeds are measured."""
    return advise(deployment, lambda: form.load(deployment))


def form_errors(form: LoadForm) -> dict[str, list[str]]:
    return {field: [str(m) for m in messages] for field, messages in form.errors.items()}


def unavailable(exc: LoadUnavailable) -> dict[str, list[str]]:
    return {exc.field: [str(exc)]}
