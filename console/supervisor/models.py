"""The supervisor's process table: one row for every child process on this node.

A deployment's workers and router are rows the supervisor keeps running from the plan. The
other kinds are requested: whoever needs one (a gate, a Celery task) writes the row with its
command and ``wanted=running``, waits for it to be ready, and sets ``wanted=stopped`` when done
(console/supervisor/process_requests.py). The supervisor alone spawns, probes, stops and reaps them all.
"""

from __future__ import annotations

from django.db import models


class ManagedProcess(models.Model):
    class State(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        FAILED = "failed"
        STOPPING = "stopping"
        STOPPED = "stopped"

    class Kind(models.TextChoices):
        WORKER = "worker"
        ROUTER = "router"
        GATE_REFERENCE = "gate-reference"
        MEASUREMENT = "measurement"
        BUILDER = "builder"
        GATEWAY = "gateway"

    class Wanted(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    ALIVE_STATES = (State.STARTING, State.READY, State.STOPPING)
    # Kept running and restarted when they exit: a deployment's from its plan, the gateway
    # (no deployment) while the console's settings turn it on.
    PLANNED_KINDS = (Kind.WORKER, Kind.ROUTER, Kind.GATEWAY)

    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.WORKER)
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="processes", null=True, blank=True)
    slot = models.CharField(max_length=50)  # "prefill-0", "decode-0", "router", "gate-7-reference"
    role = models.CharField(max_length=20)  # prefill | decode | colocated | router | builder
    port = models.PositiveIntegerField(null=True, blank=True)  # none: nothing to probe (a builder)
    # The node whose supervisor owns it (a node agent's, or `supervise`'s for the console's own
    # node); none: the console's node (requested kinds). The address it binds and is probed at.
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="processes",
                             null=True, blank=True)
    host = models.GenericIPAddressField(default="127.0.0.1")
    env = models.JSONField(default=dict, blank=True)
    # What the requester of a requested kind wants; planned kinds follow their deployment.
    wanted = models.CharField(max_length=10, choices=Wanted.choices, default=Wanted.RUNNING)
    # The process that requested it: once that one is gone, nobody waits for this one.
    owner_pid = models.PositiveIntegerField(null=True, blank=True)
    owner_started_at = models.DateTimeField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.STOPPED)
    command = models.JSONField(default=list)
    log_path = models.CharField(max_length=1000)
    restarts = models.PositiveIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    # A router whose /health answered "degraded": the role it serves without (no ready worker
    # of it, the other role serving whole requests); "" when it is not degraded.
    degraded = models.CharField(max_length=20, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "slot"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "slot"], name="process_unique_slot"),
            # A requested process has no deployment; its slot names what it serves.
            models.UniqueConstraint(fields=["slot"], condition=models.Q(deployment=None),
                                    name="process_unique_requested_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_name}/{self.slot} ({self.state})"

    @property
    def owner_name(self) -> str:
        """Its deployment's name, or for a requested process its kind."""
        return self.deployment.name if self.deployment_id else self.kind

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
