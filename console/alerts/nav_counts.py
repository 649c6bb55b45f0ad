"""The navigation bar's count of firing alerts, for every page's first paint (alerts.js keeps
it live over /ws/alerts/)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from console.accounts.roles import visible_teams
from console.alerts.streams import firing_counts


def firing_alerts(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    counts = firing_counts(visible_teams(user).values_list("pk", flat=True))
    return {"firing_alerts": sum(counts.values()), "firing_by_deployment": counts}
