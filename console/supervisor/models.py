"""The supervisor's process table: one row per process slot of a deployment."""

from __future__ import annotations

from django.db import models


class ManagedProcess(models.Model):
    class State(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        FAILED = "failed"
        STOPPING = "stopping"
        STOPPED = "stopped"

    ALIVE_STATES = (State.STARTING, State.READY, State.STOPPING)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="processes")
    slot = models.CharField(max_length=50)  # "prefill-0", "decode-0", "router"
    role = models.CharField(max_length=20)  # prefill | decode | colocated | router
    port = models.PositiveIntegerField()
    pid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.STOPPED)
    command = models.JSONField(default=list)
    log_path = models.CharField(max_length=1000)
    restarts = models.PositiveIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "slot"], name="process_unique_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment.name}/{self.slot} ({self.state})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 10, max_bytes: int = 16_384) -> list[str]:
        """The last lines of this process's log file."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, 2)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                data = handle.read()
        except OSError:
            return []
        text = data.decode("utf-8", errors="replace").splitlines()
        return text[-lines:]
