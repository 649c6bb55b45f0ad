"""The live app's API: a process's stored log lines (the browser's backfill) and their download,
and a deployment's metric history for the dashboard's charts when they open."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.live.api.serializers import LogPageSerializer, MetricHistorySerializer
from console.live.downsample import SECOND_RETENTION, floor_minute, merge, minute_buckets
from console.live.models import LogLine, MetricSample
from console.supervisor.models import ManagedProcess
from console.supervisor.visibility import visible_processes

# Log lines in one answer at most.
MAX_PAGE = 2000

Resolution = MetricSample.Resolution
WINDOWS = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(hours=24),
           "7d": timedelta(days=7)}
# A chart is a few hundred pixels wide: long windows are merged into at most this many points
# (7 days of minutes would be 10,080 samples, megabytes of JSON).
MAX_POINTS = 900


def _int_param(request: Request, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValidationError({name: f"expected an integer, got {raw!r}"}) from exc
    if not minimum <= value <= maximum:
        raise ValidationError({name: f"must be between {minimum} and {maximum}"})
    return value


@extend_schema(
    parameters=[
        ID_PARAMETER,
        OpenApiParameter("after", int, description="lines after this sequence number (0)"),
        OpenApiParameter("limit", int, description=f"at most this many lines (500, up to {MAX_PAGE})"),
        OpenApiParameter("tail", int, description="instead: the last this many lines"),
        OpenApiParameter("q", str, description="only lines containing this, in any case"),
    ],
    responses={200: LogPageSerializer, 400: OpenApiResponse(description="a parameter, named")},
)
@api_view(["GET"])
@permission_classes([TeamRole])
def process_logs(request: Request, pk: int) -> Response:
    """Lines after a sequence number (the browser's backfill), optionally matching ``q``."""
    process = get_object_or_404(visible_processes(ManagedProcess.objects, request.user), pk=pk)
    after = _int_param(request, "after", 0, 0, 2**62)
    limit = _int_param(request, "limit", 500, 1, MAX_PAGE)
    tail = _int_param(request, "tail", 0, 0, MAX_PAGE)
    lines = LogLine.objects.filter(process=process)
    query = request.query_params.get("q", "")
    if query:
        lines = lines.filter(text__icontains=query)
    if tail:
        page = list(lines.order_by("-seq")[:tail])[::-1]
        has_more = False
    else:
        page = list(lines.filter(seq__gt=after).order_by("seq")[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
    return Response({
        "process": process.pk,
        "slot": process.slot,
        "lines": [{"seq": line.seq, "created": line.created, "text": line.text} for line in page],
        "next_after": page[-1].seq if page else after,
        "has_more": has_more,
    })


@extend_schema(parameters=[ID_PARAMETER], responses={(200, "text/plain"): OpenApiResponse(
    OpenApiTypes.STR, description="every stored line of the process, each after its time")})
@api_view(["GET"])
@permission_classes([TeamRole])
def process_logs_download(request: Request, pk: int) -> StreamingHttpResponse:
    process = get_object_or_404(visible_processes(
        ManagedProcess.objects.select_related("deployment"), request.user), pk=pk)

    def rows() -> Iterator[str]:
        for line in LogLine.objects.filter(process=process).order_by("seq").iterator(2000):
            yield f"{line.created.isoformat()} {line.text}\n"

    response = StreamingHttpResponse(rows(), content_type="text/plain; charset=utf-8")
    filename = f"{process.owner_name}-{process.slot}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@extend_schema(
    parameters=[ID_PARAMETER, OpenApiParameter("window", str, enum=list(WINDOWS), default="15m")],
    responses={200: MetricHistorySerializer, 400: OpenApiResponse(description="the window, named")},
)
@api_view(["GET"])
@permission_classes([TeamRole])
def deployment_metrics(request: Request, pk: int) -> Response:
    """Samples of the last ``window``: 1 s apart up to 15 minutes, at least 1 min beyond."""
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
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
