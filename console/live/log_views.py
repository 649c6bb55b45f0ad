"""Pages: one process's live log, and one request's timeline."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from console.deployments.models import Deployment
from console.live.timeline import find_request
from console.supervisor.models import ManagedProcess


@login_required
def process_log(request: HttpRequest, process_id: int) -> HttpResponse:
    process = get_object_or_404(ManagedProcess.objects.select_related("deployment"), pk=process_id)
    return render(request, "logs/process.html", {"process": process})


@login_required
def request_timeline(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment, name=name)
    request_id = request.GET.get("id", "").strip()
    view = find_request(deployment.pk, request_id) if request_id else None
    # partial: what the page re-fetches while the request's timeline is not written yet
    template = "logs/_request.html" if request.GET.get("partial") and view else "logs/request.html"
    return render(request, template,
                  {"deployment": deployment, "request_id": request_id, "view": view})
