"""What the live views show: stored log lines and metric samples.

Everything is stored first and broadcast after, so a browser that missed a message can fetch
it again by sequence number.
"""

from __future__ import annotations

from django.db import models


class LogLine(models.Model):
    process = models.ForeignKey("supervisor.ManagedProcess", on_delete=models.CASCADE,
                                related_name="log_lines")
    # Per process, gap-free and increasing across restarts; what the browser backfills by.
    seq = models.PositiveBigIntegerField()
    created = models.DateTimeField()
    text = models.TextField()

    class Meta:
        ordering = ["process", "seq"]
        constraints = [models.UniqueConstraint(fields=["process", "seq"], name="logline_unique_seq")]

    def __str__(self) -> str:
        return f"{self.process_id}#{self.seq}: {self.text[:60]}"


class MetricSample(models.Model):
    """One compact snapshot of a deployment's numbers: every second, and per minute."""

    class Resolution(models.TextChoices):
        SECOND = "1s"
        MINUTE = "1m"

    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE,
                                   related_name="metric_samples")
    resolution = models.CharField(max_length=2, choices=Resolution.choices)
    created = models.DateTimeField()
    data = models.JSONField()

    class Meta:
        ordering = ["created"]
        indexes = [models.Index(fields=["deployment", "resolution", "created"])]


class ProcessScrape(models.Model):
    """The last raw Prometheus text scraped from one process, for the console's /metrics."""

    process = models.OneToOneField("supervisor.ManagedProcess", on_delete=models.CASCADE,
                                   related_name="scrape")
    scraped = models.DateTimeField()
    text = models.TextField()
