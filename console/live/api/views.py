from __future__ import annotations

from collections.abc import Iterator

from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.live.models import LogLine
from console.supervisor.models import ManagedProcess

MAX_PAGE = 2000


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


@api_view(["GET"])
def process_logs(request: Request, process_id: int) -> Response:
    """Lines after a sequence number (the browser's backfill), optionally matching ``q``."""
    process = get_object_or_404(ManagedProcess, pk=process_id)
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


@api_view(["GET"])
def process_logs_download(request: Request, process_id: int) -> StreamingHttpResponse:
    process = get_object_or_404(ManagedProcess.objects.select_related("deployment"), pk=process_id)

    def rows() -> Iterator[str]:
        for line in LogLine.objects.filter(process=process).order_by("seq").iterator(2000):
            yield f"{line.created.isoformat()} {line.text}\n"

    response = StreamingHttpResponse(rows(), content_type="text/plain; charset=utf-8")
    filename = f"{process.deployment.name}-{process.slot}.log"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
