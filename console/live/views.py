"""Pages: a deployment's live dashboard, one process's live log and one request's timeline;
and the Prometheus export of every process's metrics."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from console.accounts.roles import is_superuser, visible
from console.credentials.services import TokenRefused, accepted_token, note_use
from console.deployments.models import Deployment
from console.live import metrics_export
from console.live.api.views import WINDOWS
from console.live.timeline import find_request
from console.supervisor.models import ManagedProcess
from console.supervisor.visibility import visible_processes


def _deployment(request: HttpRequest, name: str) -> Deployment:
    """The deployment if the user's team owns it; 404 to anyone else, who must not learn that
    it exists."""
    return get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)


@login_required
@require_GET
def deployment_dashboard(request: HttpRequest, name: str) -> HttpResponse:
    """Live charts of one deployment: history over REST, then a point a second over a websocket."""
    deployment = _deployment(request, name)
    return render(request, "live/dashboard.html", {"deployment": deployment, "windows": list(WINDOWS)})


@login_required
@require_GET
def process_log(request: HttpRequest, process_id: int) -> HttpResponse:
    process = get_object_or_404(visible_processes(
        ManagedProcess.objects.select_related("deployment"), request.user), pk=process_id)
    return render(request, "logs/process.html", {"process": process})


@login_required
@require_GET
def request_timeline(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    request_id = request.GET.get("id", "").strip()
    view = find_request(deployment.pk, request_id) if request_id else None
    # partial: what the page re-fetches while the request's timeline is not written yet
    template = "logs/_request.html" if request.GET.get("partial") and view else "logs/request.html"
    return render(request, template,
                  {"deployment": deployment, "request_id": request_id, "view": view})


def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """The processes' metrics of the reader's teams' deployments, for their Prometheus, which
    sends an API token (``authorization: {type: Bearer, credentials: <token>}``); a browser's
    session will do too. A scrape of no deployment's process (builders, measurements) is left
    out: they have no dashboard either."""
    words = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(words) == 2 and words[0].lower() in ("bearer", "token"):
        now = timezone.now()
        try:
            token = accepted_token(words[1], now)
        except TokenRefused as refused:
            return HttpResponse(f"{refused}\n", status=401, content_type="text/plain")
        note_use(token, now)
        user = token.user
    elif request.user.is_authenticated:
        user = request.user
    else:
        return redirect_to_login(request.get_full_path())
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    deployments = (None if is_superuser(user)
                   else list(visible(Deployment.objects.all(), user).values_list("pk", flat=True)))
    return HttpResponse(metrics_export.render(timezone.now(), deployments),
                        content_type=CONTENT_TYPE_LATEST)
