from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.live import metrics_export


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Every process's metrics for the user's Prometheus; open like a worker's own /metrics."""
    return HttpResponse(metrics_export.render(timezone.now()), content_type=CONTENT_TYPE_LATEST)
