"""What the topology advisor keeps: one server's measured speeds per node and variant."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SpeedProfile(models.Model):
    """A variant served alone on a node, measured by ``python -m inference.advisor measure``:
    the speeds JSON inference/advisor/speeds.py reads (prefill against prompt length and batch,
    decode step against concurrency and context, KV hand-off against prompt length, colocated
    interference). The newest finished one of a node and variant is the one advised from."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="speed_profiles")
    variant = models.ForeignKey("catalog.Variant", on_delete=models.CASCADE,
                                related_name="speed_profiles")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    speeds = models.JSONField(default=dict, blank=True)
    # The measurement CLI's progress events so far, oldest first (shown while it runs).
    progress = models.JSONField(default=list, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"speeds of {self.variant} on {self.node.name} ({self.state})"

    @property
    def done(self) -> bool:
        return self.state in (self.State.DONE, self.State.FAILED)
