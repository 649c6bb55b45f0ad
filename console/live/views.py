"""Pages: a deployment's live dashboard, one process's live log and one request's timeline;
and the Prometheus export of every process's metrics."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.accounts.roles import visible
from console.deployments.models import Deployment
from console.live import metrics_export
from console.live.api.views import WINDOWS
from console.live.timeline import find_request
from console.supervisor.access import visible_processes
from console.supervisor.models import ManagedProcess


def _deployment(request: HttpRequest, name: str) -> Deployment:
    """The deployment if the user's team owns it; 404 to anyone else, who must not learn that
    it exists."""
    return get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)


@login_required
def deployment_dashboard(request: HttpRequest, name: str) -> HttpResponse:
    """Live charts of one deployment: history over REST, then a point a second over a websocket."""
    deployment = _deployment(request, name)
    return render(request, "live/dashboard.html", {"deployment": deployment, "windows": list(WINDOWS)})


@login_required
def process_log(request: HttpRequest, process_id: int) -> HttpResponse:
    process = get_object_or_404(visible_processes(
        ManagedProcess.objects.select_related("deployment"), request.user), pk=process_id)
    return render(request, "logs/process.html", {"process": process})


@login_required
def request_timeline(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    request_id = request.GET.get("id", "").strip()
    view = find_request(deployment.pk, request_id) if request_id else None
    # partial: what the page re-fetches while the request's timeline is not written yet
    template = "logs/_request.html" if request.GET.get("partial") and view else "logs/request.html"
    return render(request, template,
                  {"deployment": deployment, "request_id": request_id, "view": view})


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """Every process's metrics for the user's Prometheus; open like a worker's own /metrics."""
    return HttpResponse(metrics_export.render(timezone.now()), content_type=CONTENT_TYPE_LATEST)
