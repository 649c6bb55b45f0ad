from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from console.accounts.models import Role
from console.accounts.roles import may, visible
from console.deployments.models import Deployment


@login_required
@require_GET
def playground(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(visible(Deployment.objects.select_related("team"),
                                           request.user), name=name)
    return render(request, "playground/chat.html", {
        "deployment": deployment,
        # A viewer sees the page without the chat: a chat spends the team's capacity.
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR)})
