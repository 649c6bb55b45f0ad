"""Autoscaling policies of a deployment's pools, and the decisions the autoscaler made.

A policy sizes one pool (prefill, decode or colocated) between a minimum and a maximum from one
signal; a ratio band keeps prefill and decode within a P:D band of each other. Every evaluation
that changes or would change a pool is a :class:`ScalingDecision`: its inputs, the count it
computed, and what was done or why nothing was (console/autoscaling/decide.py).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from console.autoscaling.schedules import validate_schedules
from console.deployments.plans import MAX_INSTANCES


class Signal(models.TextChoices):
    QUEUE = "queue", "requests waiting in the engine's queue, per instance"
    CONCURRENCY = "concurrency", "requests in flight at the router, per instance"
    PROMPT_BACKLOG = "prompt_backlog", ("seconds to compute the prompts in flight at the "
                                        "measured prefill speed (prefill)")
    KV_USAGE = "kv_usage", "KV cache usage, mean of the pool's instances (1 = full)"
    SLO = "slo", "max(TTFT p90 / TTFT SLO, TPOT p90 / TPOT SLO) at the router"


# Defaults per signal (scale up above, down below), as the peers ship them: llm-d's KV usage at
# 0.8 and its SLO ratio at 0.55/0.40; a few requests queued or in flight per instance.
SIGNAL_DEFAULTS: dict[str, tuple[float, float]] = {
    Signal.QUEUE: (2.0, 0.5), Signal.CONCURRENCY: (4.0, 1.0), Signal.PROMPT_BACKLOG: (2.0, 0.5),
    Signal.KV_USAGE: (0.8, 0.4), Signal.SLO: (0.55, 0.40),
}


class PoolPolicy(models.Model):
    class Mode(models.TextChoices):
        OFF = "off", "off (nothing is evaluated)"
        DRY_RUN = "dry_run", "dry run (decisions are recorded, nothing changes)"
        ACTIVE = "active", "active (decisions change the pool)"

    class Role(models.TextChoices):
        PREFILL = "prefill"
        DECODE = "decode"
        COLOCATED = "colocated"

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="scaling_policies")
    role = models.CharField(max_length=10, choices=Role.choices)
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.DRY_RUN)
    signal = models.CharField(max_length=20, choices=Signal.choices)
    min_instances = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_INSTANCES)])
    max_instances = models.PositiveSmallIntegerField(
        default=2, validators=[MinValueValidator(1), MaxValueValidator(MAX_INSTANCES)])
    scale_up_at = models.FloatField(
        validators=[MinValueValidator(0.0)],
        help_text="the signal per instance above which the pool grows; also the level a new "
                  "count aims for")
    scale_down_at = models.FloatField(
        validators=[MinValueValidator(0.0)],
        help_text="the signal per instance below which the pool may shrink")
    up_window_s = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(0), MaxValueValidator(3600)],
        help_text="stabilization: the pool grows to the least count asked for over this window")
    down_window_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(0), MaxValueValidator(86_400)],
        help_text="stabilization: the pool shrinks to the largest count asked for over this window")
    max_step = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_INSTANCES)],
        help_text="instances added or removed by one decision at most")
    cooldown_s = models.PositiveIntegerField(
        default=300, validators=[MaxValueValidator(86_400)],
        help_text="after a change of the pool, no other change for this long")
    # [{"name": "morning peak", "cron": "0 8 * * 1-5", "duration_s": 7200, "min_instances": 2}]
    schedules = models.JSONField(default=list, blank=True, validators=[validate_schedules])
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "role"]
        constraints = [models.UniqueConstraint(fields=["deployment", "role"],
                                               name="pool_policy_unique_role")]

    def __str__(self) -> str:
        return f"{self.deployment.name}/{self.role} ({self.mode})"

    @property
    def team_id(self) -> int:
        """The deployment's team: the audit log scopes the policy's entries to it."""
        return self.deployment.team_id

    def clean(self) -> None:
        # full_clean runs this even when a field failed its own validation (a null count, a
        # window's minimum that is text): those errors are the fields' to report, so only
        # values of the right type are compared here.
        errors = {}
        counts = (self.min_instances, self.max_instances)
        if None not in counts and self.min_instances > self.max_instances:
            errors["max_instances"] = (f"must be at least min_instances ({self.min_instances})")
        if None not in (self.scale_down_at, self.scale_up_at) and (
                self.scale_down_at >= self.scale_up_at):
            errors["scale_down_at"] = (f"must be below scale_up_at ({self.scale_up_at:g}): "
                                       "between the two the pool is left as it is")
        windows = self.schedules if isinstance(self.schedules, list) else []
        for index, window in enumerate(windows):
            minimum = window.get("min_instances") if isinstance(window, dict) else None
            if (isinstance(minimum, int) and self.max_instances is not None
                    and minimum > self.max_instances):
                errors["schedules"] = (f"{index}: min_instances {minimum} is "
                                       f"above max_instances ({self.max_instances})")
        if errors:
            raise ValidationError(errors)


class RatioBand(models.Model):
    """Prefill instances per decode instance, kept within [min_ratio, max_ratio]."""

    deployment = models.OneToOneField("deployments.Deployment", on_delete=models.CASCADE,
                                      related_name="ratio_band")
    min_ratio = models.FloatField(validators=[MinValueValidator(0.01), MaxValueValidator(64)],
                                  help_text="fewest prefill instances per decode instance")
    max_ratio = models.FloatField(validators=[MinValueValidator(0.01), MaxValueValidator(64)],
                                  help_text="most prefill instances per decode instance")

    def __str__(self) -> str:
        return f"{self.deployment.name} P:D {self.min_ratio:g}-{self.max_ratio:g}"

    @property
    def team_id(self) -> int:
        """The deployment's team: the audit log scopes the policy's entries to it."""
        return self.deployment.team_id

    def clean(self) -> None:
        if self.min_ratio > self.max_ratio:
            raise ValidationError({"max_ratio": f"must be at least min_ratio ({self.min_ratio:g})"})


class ScalingDecision(models.Model):
    class Action(models.TextChoices):
        UP = "up"
        DOWN = "down"
        NONE = "none"

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="scaling_decisions")
    role = models.CharField(max_length=10)
    at = models.DateTimeField(help_text="the first evaluation that decided so")
    last_at = models.DateTimeField(help_text="the last evaluation that decided the same")
    evaluations = models.PositiveIntegerField(default=1,
                                              help_text="evaluations in a row that decided so")
    signal = models.CharField(max_length=20)
    value = models.FloatField(null=True, help_text="the signal per instance; null: no data")
    inputs = models.JSONField(default=dict, help_text="the series values and windows read")
    current = models.PositiveSmallIntegerField()
    desired = models.PositiveSmallIntegerField(help_text="the count the signal and bounds ask for")
    target = models.PositiveSmallIntegerField(help_text="the count the pool was set to")
    action = models.CharField(max_length=5, choices=Action.choices)
    reason = models.CharField(max_length=20, help_text="why this action, or why none")
    detail = models.CharField(max_length=500, blank=True)
    dry_run = models.BooleanField(default=False)
    # Slots added or removed, and when each became ready, joined the router, or left it.
    slots = models.JSONField(default=list, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    # Every save: the hub (embedded mode) sends rows changed since its last poll.
    changed = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["deployment", "role", "-at"])]

    def __str__(self) -> str:
        return (f"{self.deployment_id}/{self.role} {self.action} {self.current}->{self.target} "
                f"({self.reason})")


class PoolReading(models.Model):
    """One evaluation of a pool, whatever was decided: the page charts the signal from these.
    Kept for ``READINGS_KEPT_S``."""

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="pool_readings")
    role = models.CharField(max_length=10)
    at = models.DateTimeField()
    value = models.FloatField(null=True)
    asked = models.PositiveSmallIntegerField(null=True)
    current = models.PositiveSmallIntegerField()
    ready = models.PositiveSmallIntegerField()
    scale_up_at = models.FloatField()
    scale_down_at = models.FloatField()
    mode = models.CharField(max_length=10)

    class Meta:
        ordering = ["at", "pk"]
        indexes = [models.Index(fields=["deployment", "role", "at"]), models.Index(fields=["at"])]


READINGS_KEPT_S = 3600
