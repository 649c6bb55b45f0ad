from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from console.accounts.models import Role
from console.accounts.roles import may, visible
from console.deployments.images import router_max_images
from console.deployments.models import Deployment
from console.playground.gateway_models import PickableModel, gateway_models
from console.playground.proxy import ROUTER_MAX_BODY_BYTES


@login_required
@require_GET
def playground(request: HttpRequest, name: str) -> HttpResponse:
    deployment = get_object_or_404(visible(Deployment.objects.select_related("team"),
                                           request.user), name=name)
    return _chat(request, deployment)


@login_required
@require_GET
def gateway_playground(request: HttpRequest) -> HttpResponse:
    """Any model of the gateway: picked by its served name or an alias; the chat goes to the
    deployment it resolves to, as through that deployment's own playground."""
    models = gateway_models(request.user)
    asked = request.GET.get("model")
    if not asked:
        return render(request, "playground/pick.html", {"models": models})
    picked = next((m for m in models if m.name == asked), None)
    if picked is None:
        return render(request, "playground/pick.html", {
            "models": models, "refused": f"model: no model {asked!r} at the gateway that you "
                                         "may see"}, status=400)
    return _chat(request, picked.deployment, models, picked)


def _chat(request: HttpRequest, deployment: Deployment, models: list[PickableModel] | None = None,
          picked: PickableModel | None = None) -> HttpResponse:
    return render(request, "playground/chat.html", {
        "deployment": deployment, "models": models, "picked": picked,
        # Images only where the router lets them through: every variant of the plan takes
        # them (prefill and decode both read them) and the plan allows some.
        "max_images": router_max_images(deployment,
                                        list(deployment.workers.select_related("variant"))),
        "max_body_bytes": ROUTER_MAX_BODY_BYTES,
        # A viewer sees the page without the chat: a chat spends the team's capacity.
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR)})
