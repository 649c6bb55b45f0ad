"""The troubleshooting page of a deployment: the eight symptoms, re-fetched in place every few
seconds (static/pdserve/pdserve.js) from the same URL with ``?partial=1``."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from console.accounts.roles import visible
from console.deployments.models import Deployment
from console.diagnosis import services

REFRESH_MS = 5000


@login_required
@require_GET
def doctor_page(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)
    template = "diagnosis/_symptoms.html" if request.GET.get("partial") else "diagnosis/doctor.html"
    return render(request, template, {"deployment": deployment, "refresh_ms": REFRESH_MS,
                                      "refresh_s": REFRESH_MS // 1000,
                                      "report": services.report(deployment)})
