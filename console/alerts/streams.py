"""Alert changes as websocket messages: one group per team, since the dashboard and the
navigation bar's count show every alert of the reader's teams."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.alerts.matchers import matches
from console.alerts.models import Alert, AlertEvent, AlertState, Silence
from console.deployments.models import Deployment


def team_group(team_id: int) -> str:
    return f"alerts-team-{team_id}"


def firing_counts(team_ids: Iterable[int]) -> dict[int, int]:
    """Firing alerts per deployment of these teams, 0 included (the navigation bar sums them,
    the deployment list shows each)."""
    team_ids = list(team_ids)
    counts: dict[int, int] = dict.fromkeys(
        Deployment.objects.filter(team__in=team_ids).values_list("pk", flat=True), 0)
    for deployment_id in Alert.objects.filter(
            deployment__team__in=team_ids, state=AlertState.FIRING).values_list(
                "deployment_id", flat=True):
        counts[deployment_id] = counts.get(deployment_id, 0) + 1
    return counts


def alert_payload(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.pk, "rule": alert.rule_id, "deployment": alert.deployment_id,
        "deployment_name": alert.labels.get("deployment", ""),
        "alertname": alert.labels.get("alertname", ""),
        "severity": alert.labels.get("severity", ""), "labels": alert.labels,
        "summary": alert.annotations.get("summary", ""), "state": alert.state,
        "value": alert.value,
        "fired_at": alert.fired_at.isoformat() if alert.fired_at else None,
        "active_since": alert.active_since.isoformat() if alert.active_since else None,
        "acknowledged_by": alert.acknowledged_by.username if alert.acknowledged_by else None,
    }


def alert_messages(events: Iterable[AlertEvent]) -> list[tuple[str, dict[str, Any]]]:
    """Per team touched, the changed alerts as they are now and the team's firing counts."""
    return changed_alert_messages({event.alert_id for event in events})


def silence_messages(silence: Silence) -> list[tuple[str, dict[str, Any]]]:
    """The active alerts a silence matches, as they are now: its start or end adds or takes off
    their "silenced by" on the dashboard."""
    alerts = Alert.objects.filter(deployment__team=silence.team_id).exclude(
        state=AlertState.INACTIVE).only("pk", "labels")
    return changed_alert_messages({alert.pk for alert in alerts
                                   if matches(silence.matchers, alert.labels)})


def changed_alert_messages(alert_ids: set[int]) -> list[tuple[str, dict[str, Any]]]:
    if not alert_ids:
        return []
    alerts = list(Alert.objects.filter(pk__in=alert_ids).select_related(
        "deployment", "acknowledged_by"))
    by_team: dict[int, list[Alert]] = {}
    for alert in alerts:
        by_team.setdefault(alert.deployment.team_id, []).append(alert)
    return [(team_group(team_id), {
        "type": "alerts",
        "alerts": [alert_payload(alert) for alert in rows],
        # String keys, as JSON gives the browser anyway: channels-redis packs messages with
        # msgpack, whose reader refuses integer map keys (the receiving socket closes).
        "firing": {str(pk): count for pk, count in firing_counts([team_id]).items()},
    }) for team_id, rows in by_team.items()]


class EventSource:
    """For the console's hub (embedded mode): the alert events stored since the last poll."""

    def __init__(self) -> None:
        self.last_event_id = 0

    def start_from_now(self) -> None:
        latest = AlertEvent.objects.order_by("-id").values_list("id", flat=True).first()
        self.last_event_id = latest or 0

    def fetch(self) -> list[tuple[str, dict[str, Any]]]:
        events = list(AlertEvent.objects.filter(id__gt=self.last_event_id).order_by("id")[:500])
        if not events:
            return []
        self.last_event_id = events[-1].id
        return alert_messages(events)
