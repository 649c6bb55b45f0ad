"""Metric history: 1 s samples for the last 15 minutes, one merged sample per minute for 7 days."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from console.live.models import MetricSample

Resolution = MetricSample.Resolution
SECOND_RETENTION = timedelta(minutes=15)
MINUTE_RETENTION = timedelta(days=7)
MINUTE = timedelta(minutes=1)


def merge(values: Sequence[Any]) -> Any:
    """One value standing for several consecutive ones of a snapshot field.

    Numbers (rates, gauges, quantiles, CPU, RSS) are averaged over the samples that have them;
    objects merge key by key; anything else (the role, cumulative hand-off tables) keeps its
    latest value. So a minute's ``ttft_p95`` is the mean of its per-second p95s, and its ``up``
    the fraction of seconds the process answered.
    """
    present = [value for value in values if value is not None]
    if not present:
        return None
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return round(sum(present) / len(present), 6)
    if all(isinstance(v, dict) for v in present):
        keys = dict.fromkeys(key for value in present for key in value)
        return {key: merge([value.get(key) for value in present]) for key in keys}
    return present[-1]


def floor_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def minute_buckets(samples: Iterable[MetricSample]) -> dict[datetime, list[dict[str, Any]]]:
    """1 s samples grouped by the minute they fall in, oldest first."""
    buckets: dict[datetime, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples:
        buckets[floor_minute(sample.created)].append(sample.data)
    return dict(sorted(buckets.items()))


def roll_up(now: datetime) -> int:
    """Store a 1 m sample for every complete minute whose 1 s samples are not rolled up yet.

    Minutes are caught up as far back as 1 s samples are kept, so a collector that was down
    for a while, or restarted mid-minute, leaves no hole. Returns how many were stored.
    """
    current = floor_minute(now)
    oldest = current - SECOND_RETENTION
    stored = 0
    deployments = (MetricSample.objects.filter(resolution=Resolution.SECOND, created__gte=oldest)
                   .values_list("deployment_id", flat=True).distinct())
    for deployment_id in list(deployments):
        last = (MetricSample.objects.filter(deployment_id=deployment_id, resolution=Resolution.MINUTE)
                .order_by("-created").values_list("created", flat=True).first())
        start = max(oldest, last + MINUTE) if last is not None else oldest
        seconds = MetricSample.objects.filter(
            deployment_id=deployment_id, resolution=Resolution.SECOND,
            created__gte=start, created__lt=current,
        ).order_by("created")
        rows = [
            MetricSample(deployment_id=deployment_id, resolution=Resolution.MINUTE, created=minute,
                         data=merge(datas))
            for minute, datas in minute_buckets(seconds).items()
        ]
        MetricSample.objects.bulk_create(rows)
        stored += len(rows)
    return stored


def prune(now: datetime) -> int:
    """Delete samples past their retention; returns how many went."""
    removed = MetricSample.objects.filter(resolution=Resolution.SECOND,
                                          created__lt=now - SECOND_RETENTION).delete()[0]
    removed += MetricSample.objects.filter(resolution=Resolution.MINUTE,
                                           created__lt=now - MINUTE_RETENTION).delete()[0]
    return removed
