from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role
from console.accounts.roles import may, require, visible
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.quality import services
from console.quality.advice import advice
from console.quality.measure import MeasureRefused, queue_measurement


def gate_context(deployment: Deployment) -> dict[str, object]:
    """What the deployment page's gate panel shows; the page includes it, then refreshes it."""
    latest = services.latest_gate(deployment)
    applies, why = services.gate_applies(deployment)
    return {"deployment": deployment, "gate": latest, "gate_applies": applies, "gate_why": why,
            "router_hold": services.router_hold(deployment, latest),
            "variants_note": services.variants_note(deployment)}


def advice_context(deployment: Deployment) -> dict[str, object]:
    return {"deployment": deployment, "advice": advice(deployment)}


def _deployment(request: HttpRequest, name: str, role: Role = Role.VIEWER) -> Deployment:
    """The deployment if the user's team owns it (else 404) and their role there is at least
    ``role`` (else 403)."""
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)
    require(request.user, deployment.team_id, role)
    return deployment


@login_required
@require_GET
def gate_panel(request: HttpRequest, name: str) -> HttpResponse:
    return render(request, "quality/_gate.html", gate_context(_deployment(request, name)))


@login_required
@require_POST
def gate_run(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    try:
        services.request_gate(deployment)
    except services.GateRefused as exc:
        return render(request, "quality/refused.html",
                      {"deployment": deployment, "action": "Run the output gate",
                       "reason": str(exc)}, status=409)
    return redirect("deployment-detail", name=name)


@login_required
@require_GET
def advice_panel(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    return render(request, "quality/_advice.html", {
        **advice_context(deployment),
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR)})


@login_required
@require_POST
def measure(request: HttpRequest, name: str) -> HttpResponse:
    """Measure a variant of the deployment's model on a role's node, from the plan page's
    advice table: the deployment's operators may (console/quality/measure_permission.py)."""
    deployment = _deployment(request, name, Role.OPERATOR)
    variant = get_object_or_404(Variant, pk=request.POST.get("variant") or 0,
                                base=deployment.base_model_id)
    node = get_object_or_404(Node, pk=request.POST.get("node") or 0)
    try:
        queue_measurement(variant, node, deployment.dtype)
    except MeasureRefused as exc:
        return render(request, "quality/refused.html",
                      {"deployment": deployment, "action": f"Measure {variant} on {node.name}",
                       "reason": str(exc)}, status=409)
    return redirect("deployment-detail", name=name)
