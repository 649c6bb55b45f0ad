"""Changes to rules, silences, acknowledgements and notifiers, each with its audit entry, for the
API and the pages alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from console.alerts.models import Alert, AlertRule, Notifier, Silence
from console.alerts.notifiers.targets import audit_url
from console.alerts.streams import changed_alert_messages, silence_messages
from console.audit.entries import delete_recorded, record, snapshot
from console.live.broadcast import send_all

RULE_FIELDS = ("name", "enabled", "series", "role", "aggregation", "window_s", "comparison",
               "threshold", "for_s", "keep_firing_for_s", "severity", "scope", "labels",
               "summary", "runbook_url", "min_count", "nodata", "inhibits")
SILENCE_FIELDS = ("matchers", "starts_at", "ends_at", "comment", "expired_early_at")
NOTIFIER_FIELDS = ("name", "kind", "enabled", "url", "recipients", "send_resolved",
                   "send_resolved_when_silenced", "min_severity", "timeout_s", "max_attempts")


def _team(rule: AlertRule) -> int:
    return rule.deployment.team_id


def _send_after_commit(messages: Callable[[], list[tuple[str, dict[str, Any]]]]) -> None:
    """Tell the dashboards once the change is stored. No hub source polls acknowledgements or
    silences, so whoever stores one sends it: with Redis to every console's sockets, without
    to this process's own (the embedded console's only web process)."""
    transaction.on_commit(lambda: async_to_sync(send_all)(messages()))


@transaction.atomic
def create_rule(fields: dict[str, Any]) -> AlertRule:
    rule = AlertRule.objects.create(**fields)
    record("alert_rule.create", rule, after=snapshot(rule, RULE_FIELDS), team_id=_team(rule))
    return rule


@transaction.atomic
def update_rule(rule: AlertRule, changes: dict[str, Any]) -> AlertRule:
    before = snapshot(rule, RULE_FIELDS)
    for name, value in changes.items():
        setattr(rule, name, value)
    rule.save()
    record("alert_rule.edit", rule, before=before, after=snapshot(rule, RULE_FIELDS),
           team_id=_team(rule))
    return rule


@transaction.atomic
def delete_rule(rule: AlertRule) -> None:
    # A rule's team is its deployment's, which delete_recorded cannot see.
    before, team_id, rule_id, name = snapshot(rule, RULE_FIELDS), _team(rule), rule.pk, str(rule)
    rule.delete()
    record("alert_rule.delete", object_type="alerts.alertrule", object_id=rule_id,
           object_repr=name, team_id=team_id, before=before)


@transaction.atomic
def create_silence(fields: dict[str, Any], user: AbstractBaseUser | None) -> Silence:
    silence = Silence.objects.create(
        created_by=user if user is not None and user.is_authenticated else None, **fields)
    record("silence.create", silence, after=snapshot(silence, SILENCE_FIELDS))
    _send_after_commit(lambda: silence_messages(silence))
    return silence


@transaction.atomic
def expire_silence(silence: Silence) -> Silence:
    """End a silence now (Alertmanager's expire); expiring twice keeps the first time."""
    before = snapshot(silence, SILENCE_FIELDS)
    if silence.expired_early_at is None and silence.ends_at > timezone.now():
        silence.expired_early_at = timezone.now()
        silence.save(update_fields=["expired_early_at"])
    record("silence.expire", silence, before=before, after=snapshot(silence, SILENCE_FIELDS))
    _send_after_commit(lambda: silence_messages(silence))
    return silence


@transaction.atomic
def acknowledge(alert: Alert, user: AbstractBaseUser, comment: str) -> Alert:
    """Someone is on it: the alert keeps firing and notifying, the dashboard says who."""
    fields = ("acknowledged_by", "acknowledged_at", "ack_comment")
    before = snapshot(alert, fields)
    alert.acknowledged_by = user  # type: ignore[assignment]
    alert.acknowledged_at = timezone.now()
    alert.ack_comment = comment
    alert.save(update_fields=list(fields))
    record("alert.acknowledge", alert, before=before, after=snapshot(alert, fields),
           team_id=alert.deployment.team_id)
    _send_after_commit(lambda: changed_alert_messages({alert.pk}))
    return alert


def _notifier_snapshot(notifier: Notifier) -> dict[str, Any]:
    """The notifier's fields for its audit entry, the webhook URL masked (every member of the
    team reads the entry; the URL is often the receiver's credential) with a tag that shows
    when it changed."""
    fields = snapshot(notifier, NOTIFIER_FIELDS)
    fields["url"] = audit_url(notifier.url)
    return fields


@transaction.atomic
def create_notifier(fields: dict[str, Any]) -> Notifier:
    notifier = Notifier.objects.create(**fields)
    record("notifier.create", notifier, after=_notifier_snapshot(notifier))
    return notifier


@transaction.atomic
def update_notifier(notifier: Notifier, changes: dict[str, Any]) -> Notifier:
    before = _notifier_snapshot(notifier)
    for name, value in changes.items():
        setattr(notifier, name, value)
    notifier.save()
    record("notifier.edit", notifier, before=before, after=_notifier_snapshot(notifier))
    return notifier


@transaction.atomic
def delete_notifier(notifier: Notifier) -> None:
    delete_recorded("notifier.delete", notifier, _notifier_snapshot(notifier))
