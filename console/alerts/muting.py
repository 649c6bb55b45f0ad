"""What mutes an alert: an active silence of its deployment's team, or a firing alert of the same
deployment whose rule inhibits it (Alertmanager's silences and inhibition rules)."""

from __future__ import annotations

from datetime import datetime

from console.alerts.matchers import matches
from console.alerts.models import Alert, AlertState, Silence
from console.deployments.models import Deployment


def muted_by(alerts: list[Alert], now: datetime) -> dict[int, str]:
    """Alert id -> what mutes it: an active silence of the deployment's team, or a firing alert
    of the same deployment whose rule inhibits it."""
    deployments = {alert.deployment_id for alert in alerts}
    teams = dict(Deployment.objects.filter(pk__in=deployments).values_list("pk", "team_id"))
    silences = list(Silence.objects.filter(team_id__in=set(teams.values()), starts_at__lte=now,
                                           ends_at__gt=now, expired_early_at__isnull=True))
    sources = list(Alert.objects.filter(deployment_id__in=deployments, state=AlertState.FIRING)
                   .exclude(rule__inhibits=[]).select_related("rule"))
    # This tick's own changes count, before they are stored.
    current = {alert.pk: alert for alert in alerts}
    sources = [current.get(source.pk, source) for source in sources]
    sources += [a for a in alerts if a.state == AlertState.FIRING and a.rule.inhibits
                and a.pk not in {s.pk for s in sources}]
    muted: dict[int, str] = {}
    for alert in alerts:
        for silence in silences:
            if silence.team_id == teams[alert.deployment_id] and matches(silence.matchers,
                                                                         alert.labels):
                muted[alert.pk] = f"silence #{silence.pk}"
                break
        else:
            for source in sources:
                if (source.state == AlertState.FIRING and source.pk != alert.pk
                        and source.deployment_id == alert.deployment_id
                        and matches(source.rule.inhibits, alert.labels)):
                    muted[alert.pk] = f"inhibited by {source.labels.get('alertname', '')}"
                    break
    return muted
