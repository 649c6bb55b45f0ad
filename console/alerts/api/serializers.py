from __future__ import annotations

import math
import re
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from console.accounts.models import Role, Team
from console.accounts.roles import may, visible
from console.alerts import series as catalog
from console.alerts.evaluation import TICK_FACTS, TICK_S
from console.alerts.matchers import LABEL_NAME, validate
from console.alerts.models import (
    Aggregation,
    Alert,
    AlertEvent,
    AlertRule,
    Delivery,
    DeliveryAttempt,
    Notifier,
    Scope,
    Silence,
)
from console.alerts.notifiers.targets import TargetRefused, check_url, masked_url
from console.deployments.models import Deployment

# The collector's interval: a window must hold at least one snapshot.
SCRAPE_S = 1.0
# Labels the evaluator sets itself; a rule's labels may not redefine them.
RESERVED_LABELS = {"alertname", "deployment", "severity", "series", "role", "process", "rule"}
PLACEHOLDERS = {"deployment", "role", "instance", "value", "threshold", "series"}


class AlertRuleSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="name", queryset=Deployment.objects.all())
    series = serializers.ChoiceField(choices=sorted(catalog.SERIES))
    threshold = serializers.FloatField(help_text="a finite number")
    alertname = serializers.CharField(read_only=True)
    firing = serializers.SerializerMethodField()

    class Meta:
        model = AlertRule
        fields = ["id", "deployment", "key", "name", "alertname", "enabled", "series", "role",
                  "aggregation", "window_s", "comparison", "threshold", "for_s",
                  "keep_firing_for_s", "severity", "scope", "labels", "summary", "runbook_url",
                  "min_count", "nodata", "inhibits", "firing", "created", "updated"]
        read_only_fields = ["key", "created", "updated"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["deployment"].queryset = visible(Deployment.objects.all(), request.user)

    def get_firing(self, rule: AlertRule) -> int:
        return sum(1 for alert in rule.alerts.all() if alert.state == "firing")

    def validate_threshold(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("a finite number (not NaN or infinite)")
        return value

    def validate_deployment(self, deployment: Deployment) -> Deployment:
        if self.instance is not None and deployment.pk != self.instance.deployment_id:
            raise serializers.ValidationError("a rule stays with its deployment")
        return deployment

    def validate_labels(self, labels: Any) -> dict[str, str]:
        if not isinstance(labels, dict):
            raise serializers.ValidationError("an object of label names to strings")
        for name, value in labels.items():
            if not LABEL_NAME.match(str(name)):
                raise serializers.ValidationError(f"{name!r} is not a label name")
            if name in RESERVED_LABELS:
                raise serializers.ValidationError(f"{name!r} is set by the evaluator")
            if not isinstance(value, str):
                raise serializers.ValidationError(f"{name}: a string value")
        return labels

    def validate_inhibits(self, inhibits: Any) -> list[dict[str, str]]:
        if inhibits in (None, []):
            return []
        try:
            return validate(inhibits, "inhibits")
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate_summary(self, summary: str) -> str:
        unknown = sorted(set(re.findall(r"\{(\w+)\}", summary)) - PLACEHOLDERS)
        if unknown:
            raise serializers.ValidationError(
                f"unknown placeholder(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(PLACEHOLDERS))}")
        return summary

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def current(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            if self.instance is not None:
                return getattr(self.instance, name)
            return AlertRule._meta.get_field(name).get_default()

        definition = catalog.get(current("series"))
        errors: dict[str, str] = {}
        role, scope = current("role"), current("scope")
        if role and role not in definition.roles:
            errors["role"] = (f"{definition.name} has no role {role!r}" if definition.roles
                              else f"{definition.name} is a deployment series: leave role empty")
        if not definition.per_process and scope != Scope.DEPLOYMENT:
            errors["scope"] = f"{definition.name} is a deployment series: scope deployment"
        interval = TICK_S if definition.name in TICK_FACTS else SCRAPE_S
        window = current("window_s")
        if window < interval:
            errors["window_s"] = (f"shorter than the series' interval ({interval:g} s): "
                                  "the window would hold no point")
        elif current("aggregation") == Aggregation.RATE and window < 2 * interval:
            errors["window_s"] = f"rate needs two points: at least {2 * interval:g} s"
        if current("min_count") and not definition.is_ratio:
            errors["min_count"] = f"only ratio series count requests; {definition.name} is not one"
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class AlertSerializer(serializers.ModelSerializer):
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    rule_name = serializers.CharField(source="rule.name", read_only=True)
    acknowledged_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Alert
        fields = ["id", "rule", "rule_name", "deployment", "fingerprint", "labels",
                  "annotations", "state", "value", "active_since", "fired_at", "resolved_at",
                  "evaluated_at", "acknowledged_by", "acknowledged_at", "ack_comment"]
        read_only_fields = fields


class AcknowledgeSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=500, allow_blank=True, required=False, default="")


class AlertEventSerializer(serializers.ModelSerializer):
    alert = AlertSerializer(read_only=True)

    class Meta:
        model = AlertEvent
        fields = ["id", "at", "from_state", "to_state", "value", "muted_by", "alert"]
        read_only_fields = fields


class SilenceSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(),
                                        required=False,
                                        help_text="default: the one team where you are operator")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.SerializerMethodField()

    class Meta:
        model = Silence
        fields = ["id", "team", "matchers", "starts_at", "ends_at", "comment", "created_by",
                  "created", "expired_early_at", "state"]
        read_only_fields = ["created", "expired_early_at"]

    def get_state(self, silence: Silence) -> str:
        now = timezone.now()
        if silence.expired_early_at is not None or silence.ends_at <= now:
            return "expired"
        return "active" if silence.starts_at <= now else "pending"

    def validate_matchers(self, matchers: Any) -> list[dict[str, str]]:
        try:
            return validate(matchers)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        starts = attrs.get("starts_at", getattr(self.instance, "starts_at", None))
        ends = attrs.get("ends_at", getattr(self.instance, "ends_at", None))
        if starts is not None and ends is not None and ends <= starts:
            raise serializers.ValidationError({"ends_at": "after starts_at"})
        return attrs


class NotifierSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(),
                                        required=False,
                                        help_text="default: the one team where you are admin")

    class Meta:
        model = Notifier
        fields = ["id", "team", "name", "kind", "enabled", "url", "recipients", "send_resolved",
                  "send_resolved_when_silenced", "min_severity", "timeout_s", "max_attempts",
                  "created"]
        read_only_fields = ["created"]
        extra_kwargs = {"timeout_s": {"min_value": 0.1, "max_value": 60.0},
                        "max_attempts": {"min_value": 1, "max_value": 20}}

    def validate_url(self, url: str) -> str:
        if self.instance is not None and url and url == masked_url(self.instance.url):
            return self.instance.url  # the masked form a reader got, sent back: unchanged
        if url:
            try:
                check_url(url)
            except TargetRefused as exc:
                raise serializers.ValidationError(str(exc)) from None
        return url

    def to_representation(self, notifier: Notifier) -> dict[str, Any]:
        """A webhook's URL is often its credential: whoever may not edit the notifier (a viewer
        or operator of its team) reads ``scheme://host/…``. Leaving ``url`` out of an edit keeps
        it."""
        data = super().to_representation(notifier)
        request = self.context.get("request")
        user = getattr(request, "user", None)
        if user is None or not may(user, notifier.team_id, Role.ADMIN):
            data["url"] = masked_url(notifier.url)
        return data

    def validate_recipients(self, recipients: Any) -> list[str]:
        field = serializers.EmailField()
        if not isinstance(recipients, list):
            raise serializers.ValidationError("a list of email addresses")
        return [field.run_validation(address) for address in recipients]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        url = attrs.get("url", getattr(self.instance, "url", ""))
        recipients = attrs.get("recipients", getattr(self.instance, "recipients", []))
        if kind == Notifier.Kind.WEBHOOK and not url:
            raise serializers.ValidationError({"url": "a webhook needs its receiver's URL"})
        if kind == Notifier.Kind.EMAIL and not recipients:
            raise serializers.ValidationError({"recipients": "an email notifier needs at least "
                                                             "one address"})
        if self.instance is not None and "team" in attrs and attrs["team"] != self.instance.team:
            raise serializers.ValidationError({"team": "a notifier stays in its team"})
        return attrs


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["at", "ok", "status_code", "error", "duration_ms"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    notifier = serializers.SlugRelatedField(slug_field="name", read_only=True)
    deployment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    attempt_log = DeliveryAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "notifier", "deployment", "status", "state", "attempts",
                  "next_attempt_at", "created", "finished_at", "payload", "attempt_log"]
        read_only_fields = fields
