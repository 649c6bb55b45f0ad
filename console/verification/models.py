"""Verification reports: one run of the post-start verification of a running deployment.

Each report holds its sections (connectivity, function, performance, stress, logs, resources)
as they finish, so a page or ``manage.py verify`` shows them while the rest still runs.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


class VerificationReport(models.Model):
    class State(models.TextChoices):
        WAITING = "waiting"  # queued after a start or promotion: runs once the deployment is ready
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"      # every section ran; ``verdict`` says how it went
        ERROR = "error"    # could not run to the end; ``error`` says why

    class Verdict(models.TextChoices):
        PASS = "pass"
        WARN = "warn"
        FAIL = "fail"

    class Trigger(models.TextChoices):
        DEMAND = "demand"    # the deployment page's button or the API
        COMMAND = "command"  # manage.py verify
        START = "start"      # after a start, once the deployment is ready (its plan's setting)
        PROMOTION = "promotion"  # after a rollout's promotion, likewise
        GREEN = "green"      # a rollout's green alone, before its promotion (its setting)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="verifications")
    # The live revision's number when the report was queued (green's, for a green report).
    # Kept as data: the rollouts app sits above this one in the layer order, so no foreign key
    # to its Revision.
    revision = models.PositiveIntegerField(null=True, blank=True)
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    verdict = models.CharField(max_length=4, choices=Verdict.choices, blank=True)
    budget_s = models.PositiveIntegerField(help_text="time budget of the whole report, seconds")
    # Parameters of the run: the sweep's size and the stress run's length.
    options = models.JSONField(default=dict, blank=True)
    # The finished sections in order: {name, verdict, summary, numbers, evidence, seconds}.
    sections = models.JSONField(default=list, blank=True)
    # What runs now: {"section": name, "message": text}; {} once done.
    progress = models.JSONField(default=dict, blank=True)
    # Against the deployment's previous finished report: {previous, previous_revision,
    # regressions: [...]}; {} when there is none.
    comparison = models.JSONField(default=dict, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.deployment.name} verification #{self.pk} ({self.state})"

    @property
    def done(self) -> bool:
        return self.state in (self.State.DONE, self.State.ERROR)

    @property
    def passing(self) -> bool:
        """Finished with no failing section (warnings allowed)."""
        return self.state == self.State.DONE and self.verdict != self.Verdict.FAIL

    def section(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.sections if s.get("name") == name), None)

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds(), 1)
