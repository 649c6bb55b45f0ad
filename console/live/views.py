from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.deployments.models import Deployment
from console.live import metrics_export
from console.live.api.metrics import WINDOWS


@login_required
def deployment_dashboard(request: HttpRequest, name: str) -> HttpResponse:
    """Live charts of one deployment: history over REST, then a point a second over a websocket."""
    deployment = get_object_or_404(Deployment, name=name)
    return render(request, "live/dashboard.html", {"deployment": deployment, "windows": list(WINDOWS)})


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Every process's metrics for the user's Prometheus; open like a worker's own /metrics."""
    return HttpResponse(metrics_export.render(timezone.now()), content_type=CONTENT_TYPE_LATEST)
