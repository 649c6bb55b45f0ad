"""Output quality: gate results of deployments, and variants measured on nodes."""

from __future__ import annotations

from django.db import models


class GateResult(models.Model):
    """One run of the output gate on a deployment's workers (inference/output_gate.py)."""

    class State(models.TextChoices):
        QUEUED = "queued"  # waits for every worker to be ready
        RUNNING = "running"
        PASSED = "passed"
        FAILED = "failed"  # ran, below the thresholds
        ERROR = "error"  # could not run
        CANCELLED = "cancelled"

    class Trigger(models.TextChoices):
        START = "start"  # holds the router until it is done
        DEMAND = "demand"  # the button or the API; traffic flows meanwhile

    DONE_STATES = (State.PASSED, State.FAILED, State.ERROR, State.CANCELLED)

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="gate_results")
    trigger = models.CharField(max_length=10, choices=Trigger.choices)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    # The plan's settings when the gate was queued.
    prompts = models.PositiveSmallIntegerField()
    min_agreement = models.FloatField()
    max_mean_delta = models.FloatField()
    action = models.CharField(max_length=10)
    reference = models.CharField(max_length=300, blank=True, help_text="variant and dtype")
    # inference.output_gate's report: totals, candidates with per-prompt rows, reasons.
    report = models.JSONField(default=dict, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.deployment.name} gate #{self.pk} ({self.state})"

    @property
    def done(self) -> bool:
        return self.state in self.DONE_STATES

    @property
    def totals(self) -> dict[str, float]:
        return dict(self.report.get("totals", {}))

    @property
    def reasons(self) -> list[str]:
        return list(self.report.get("reasons", []))


class VariantMeasurement(models.Model):
    """A variant served alone on a node: its prefill and decode speed and its gate against the
    base model's unquantized variant. The plan page's advice per role reads these."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    variant = models.ForeignKey("catalog.Variant", on_delete=models.CASCADE,
                                related_name="measurements")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="measurements")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    dtype = models.CharField(max_length=20, help_text="compute dtype it was served with")
    cores = models.CharField(max_length=200, blank=True)
    reference = models.CharField(max_length=300, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    prefill_tps = models.FloatField(null=True, blank=True, help_text="prompt tokens per second")
    decode_tps = models.FloatField(null=True, blank=True,
                                   help_text="generated tokens per second, one stream")
    gate = models.JSONField(default=dict, blank=True, help_text="output gate report vs the base")
    error = models.CharField(max_length=1000, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The Celery worker running it: one killed mid-run never finishes the row, so the
    # supervise daemon fails it once this process is gone (quality/measure.py, reap_orphans).
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    worker_started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.variant} on {self.node.name} ({self.state})"

    @property
    def agreement(self) -> float | None:
        value = self.gate.get("totals", {}).get("agreement")
        return None if value is None else float(value)

    @property
    def mean_delta(self) -> float | None:
        value = self.gate.get("totals", {}).get("mean_abs_logprob_delta")
        return None if value is None else float(value)
