"""A deployment's metric history, for the dashboard's charts when they open."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.deployments.models import Deployment
from console.live.downsample import SECOND_RETENTION, floor_minute, merge, minute_buckets
from console.live.models import MetricSample

Resolution = MetricSample.Resolution
WINDOWS = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(hours=24),
           "7d": timedelta(days=7)}
# A chart is a few hundred pixels wide: long windows are merged into at most this many points
# (7 days of minutes would be 10,080 samples, megabytes of JSON).
MAX_POINTS = 900


@api_view(["GET"])
def deployment_metrics(request: Request, deployment_id: int) -> Response:
    """Samples of the last ``window``: 1 s apart up to 15 minutes, at least 1 min beyond."""
    deployment = get_object_or_404(Deployment, pk=deployment_id)
    name = request.query_params.get("window", "15m")
    if name not in WINDOWS:
        raise ValidationError({"window": f"must be one of {', '.join(WINDOWS)}, got {name!r}"})
    window = WINDOWS[name]
    now = timezone.now()
    since = now - window
    if window <= SECOND_RETENTION:
        resolution, step = Resolution.SECOND, timedelta(seconds=1)
        points = [(sample.created, sample.data) for sample in _samples(deployment, Resolution.SECOND, since)]
    else:
        resolution = Resolution.MINUTE
        step = timedelta(minutes=math.ceil(window / (MAX_POINTS * timedelta(minutes=1))))
        points = _minute_points(deployment, since)
        if step > timedelta(minutes=1):
            points = _coarsen(points, step)
    return Response({
        "deployment": deployment.pk,
        "window": name,
        "resolution": resolution,
        "step_s": int(step.total_seconds()),
        "samples": [{"at": at.isoformat(), "data": data} for at, data in points],
    })


def _samples(deployment: Deployment, resolution: str, since: datetime) -> list[MetricSample]:
    return list(MetricSample.objects.filter(deployment=deployment, resolution=resolution,
                                            created__gte=since).order_by("created"))


def _minute_points(deployment: Deployment, since: datetime) -> list[tuple[datetime, Any]]:
    """Stored 1 m samples, then the minutes not rolled up yet merged on the fly from 1 s ones."""
    points = [(sample.created, sample.data)
              for sample in _samples(deployment, Resolution.MINUTE, floor_minute(since))]
    rolled_until = points[-1][0] + timedelta(minutes=1) if points else since
    recent = MetricSample.objects.filter(deployment=deployment, resolution=Resolution.SECOND,
                                         created__gte=rolled_until).order_by("created")
    points += [(minute, merge(datas)) for minute, datas in minute_buckets(recent).items()]
    return points


def _coarsen(points: list[tuple[datetime, Any]], step: timedelta) -> list[tuple[datetime, Any]]:
    """Merge consecutive points into buckets of ``step``, aligned on the epoch."""
    seconds = step.total_seconds()
    buckets: dict[float, list[tuple[datetime, Any]]] = {}
    for at, data in points:
        buckets.setdefault(at.timestamp() // seconds, []).append((at, data))
    return [(rows[0][0], merge([data for _, data in rows])) for rows in buckets.values()]
