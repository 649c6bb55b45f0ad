from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from console.deployments.models import Deployment


@login_required
def playground(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(Deployment, name=name)
    return render(request, "playground/chat.html", {"deployment": deployment})
