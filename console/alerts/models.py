"""Alerting: rules over the collector's series, the alerts they raise, silences, notifiers and
every delivery attempt.

The semantics are Prometheus' and Alertmanager's, so that their users read them without a
manual: ``for`` holds a true condition in *pending* before it fires, ``keep_firing_for`` keeps a
firing alert up through short dips, silences match labels until they expire, a firing source
alert inhibits target alerts of its deployment, and webhooks get Alertmanager's version 4 payload.
NoData is a state of its own, as in Grafana, and each rule chooses what it means.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.db import models

from console.accounts.roles import default_team_id
from console.alerts.rule_states import ALERTING_STATES


class Aggregation(models.TextChoices):
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    LAST = "last"
    RATE = "rate"  # per-second increase of a counter over the window
    ABSENT = "absent"  # 1 while the window holds no point, else 0


class Comparison(models.TextChoices):
    GT = ">"
    GE = ">="
    LT = "<"
    LE = "<="
    EQ = "=="
    NE = "!="


class Severity(models.TextChoices):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class Scope(models.TextChoices):
    DEPLOYMENT = "deployment"  # one alert for the deployment: its instances folded together
    ROLE = "role"  # one alert per role
    INSTANCE = "instance"  # one alert per process slot


class NoDataPolicy(models.TextChoices):
    NODATA = "nodata"  # an alert state of its own, notified as such
    ALERTING = "alerting"  # missing data counts as the condition being true
    OK = "ok"  # missing data counts as the condition being false
    KEEP_LAST = "keep_last"  # nothing changes until data comes back


class AlertState(models.TextChoices):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    NODATA = "nodata"


class AlertRule(models.Model):
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="alert_rules")
    # Ready-made rules carry their key (``worker_down``...): the deployment gets each once, and
    # an inhibiting rule names its targets by key or by label.
    key = models.SlugField(max_length=60, blank=True)
    name = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    series = models.CharField(max_length=60, help_text="a series of console/alerts/series.py")
    role = models.CharField(max_length=20, blank=True,
                            help_text="only this role's processes (empty: every role the series has)")
    aggregation = models.CharField(max_length=10, choices=Aggregation.choices,
                                   default=Aggregation.AVG)
    window_s = models.PositiveIntegerField(default=60, help_text="the aggregation's window")
    comparison = models.CharField(max_length=2, choices=Comparison.choices, default=Comparison.GT)
    threshold = models.FloatField()
    for_s = models.PositiveIntegerField(default=0, help_text="true this long before it fires")
    keep_firing_for_s = models.PositiveIntegerField(
        default=0, help_text="keeps firing this long after the condition cleared")
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    scope = models.CharField(max_length=12, choices=Scope.choices, default=Scope.DEPLOYMENT)
    labels = models.JSONField(default=dict, blank=True)
    summary = models.CharField(max_length=500, blank=True,
                               help_text="a template: {deployment} {role} {instance} {value} "
                                         "{threshold} {series}")
    runbook_url = models.URLField(blank=True)
    min_count = models.PositiveIntegerField(
        default=0, help_text="a ratio rule does not evaluate on fewer requests in its window")
    nodata = models.CharField(max_length=10, choices=NoDataPolicy.choices,
                              default=NoDataPolicy.NODATA)
    # Label matchers (Alertmanager's ``target_matchers``) of the alerts of the same deployment
    # that this rule mutes while one of its alerts fires.
    inhibits = models.JSONField(default=list, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "pk"]
        constraints = [models.UniqueConstraint(
            fields=["deployment", "key"], condition=~models.Q(key=""), name="alertrule_unique_key")]

    def __str__(self) -> str:
        return f"{self.deployment.name}: {self.name}"

    @property
    def alertname(self) -> str:
        """The ``alertname`` label, CamelCase as in Prometheus' rules: "worker down" -> WorkerDown."""
        words = re.findall(r"[A-Za-z0-9]+", self.name) or ["Alert"]
        name = "".join(word[:1].upper() + word[1:] for word in words)
        return name if name[0].isalpha() else f"Alert{name}"


class Alert(models.Model):
    """One instance of a rule (a label set): its current state and when it got there."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="alerts")
    # Alertmanager's fingerprint: a stable hash of the labels, unique per rule.
    fingerprint = models.CharField(max_length=16)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=10, choices=AlertState.choices,
                             default=AlertState.INACTIVE)
    value = models.FloatField(null=True, blank=True)
    # When the condition first held in this episode (pending, then firing); Alertmanager's
    # startsAt is ``fired_at``.
    active_since = models.DateTimeField(null=True, blank=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    last_true_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    # When this episode's firing was notified unmuted: its resolution is notified only then
    # (or where a notifier asks for silenced ones too), as Alertmanager's notification log does.
    notified_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                        on_delete=models.SET_NULL, related_name="+")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    ack_comment = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-pk"]
        constraints = [models.UniqueConstraint(fields=["rule", "fingerprint"],
                                               name="alert_unique_fingerprint")]
        indexes = [models.Index(fields=["deployment", "state"])]

    def __str__(self) -> str:
        return f"{self.rule.name} {self.labels} ({self.state})"


class AlertEvent(models.Model):
    """A change of an alert's state, with the value that caused it: the alert history."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="alert_events")
    at = models.DateTimeField()
    from_state = models.CharField(max_length=10, choices=AlertState.choices)
    to_state = models.CharField(max_length=10, choices=AlertState.choices)
    value = models.FloatField(null=True, blank=True)
    # Whether a silence or an inhibiting alert muted the change when it happened.
    muted_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["deployment", "at"])]

    @property
    def resolved(self) -> bool:
        """An episode that was notified (firing or NoData) ended: rule_states' definition."""
        return self.from_state in ALERTING_STATES and self.to_state not in ALERTING_STATES


class Silence(models.Model):
    """Alertmanager's silence: label matchers (all must match) between two instants."""

    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="silences",
                             default=default_team_id)
    # [{"name": "deployment", "value": "demo", "op": "="}], op one of = != =~ !~
    matchers = models.JSONField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    comment = models.CharField(max_length=500)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    expired_early_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-starts_at", "-pk"]

    def __str__(self) -> str:
        return f"silence #{self.pk}: {self.matchers}"


class Notifier(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook"  # Alertmanager's webhook payload, version 4
        EMAIL = "email"  # through Django's mail backend

    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="notifiers",
                             default=default_team_id)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    url = models.URLField(blank=True, max_length=500, help_text="the webhook's receiver")
    recipients = models.JSONField(default=list, blank=True, help_text="email addresses")
    # Alertmanager's send_resolved; a silenced alert's resolution only when asked for.
    send_resolved = models.BooleanField(default=True)
    send_resolved_when_silenced = models.BooleanField(default=False)
    min_severity = models.CharField(max_length=10, choices=Severity.choices,
                                    default=Severity.INFO)
    timeout_s = models.FloatField(default=5.0)
    max_attempts = models.PositiveSmallIntegerField(default=5)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"],
                                               name="notifier_unique_name")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Delivery(models.Model):
    """One notification to one notifier: its payload and every attempt, until sent or given up."""

    class State(models.TextChoices):
        PENDING = "pending"  # due at ``next_attempt_at``
        SENT = "sent"
        FAILED = "failed"  # gave up after ``max_attempts``

    notifier = models.ForeignKey(Notifier, on_delete=models.CASCADE, related_name="deliveries")
    deployment = models.ForeignKey("deployments.Deployment", null=True, on_delete=models.SET_NULL,
                                   related_name="+")
    status = models.CharField(max_length=10, help_text="firing or resolved")
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    alerts = models.ManyToManyField(Alert, related_name="deliveries")

    class Meta:
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    at = models.DateTimeField()
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    duration_ms = models.FloatField()

    class Meta:
        ordering = ["delivery", "at"]


class EvaluatorLease(models.Model):
    """The one evaluator allowed to run: a row whose holder renews it before it expires.

    Every console process may run an evaluator loop; the one holding the lease evaluates, the
    others wait for it to lapse. A row in the database works on SQLite and PostgreSQL alike.
    """

    name = models.CharField(max_length=40, unique=True)
    holder = models.CharField(max_length=200)
    expires_at = models.DateTimeField()


class Fact(models.Model):
    """The latest value of a deployment series that no process exports (a gate failed, a port
    someone else holds): the console's /metrics exports it, so the Prometheus rule file can
    watch the same thing."""

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="alert_facts")
    series = models.CharField(max_length=60)
    value = models.FloatField()
    at = models.DateTimeField()

    class Meta:
        ordering = ["deployment", "series"]
        constraints = [models.UniqueConstraint(fields=["deployment", "series"],
                                               name="fact_unique_series")]
