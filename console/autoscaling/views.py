"""The autoscaling page of a deployment: each pool's counts, policy, signal chart and mode
switch, and the decisions; autoscaling.js keeps the charts and the decisions live over the
deployment's socket. Policies change through services.save_policy, as over the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role
from console.accounts.roles import may, require, visible
from console.autoscaling import services
from console.autoscaling.forms import ModeForm, PolicyForm, add_errors
from console.autoscaling.models import READINGS_KEPT_S, PoolPolicy, PoolReading, ScalingDecision
from console.autoscaling.pool_states import pool_states
from console.autoscaling.scaling_messages import decision_data, reading_data
from console.deployments.models import Deployment

DECISIONS_SHOWN = 50
# The switch's buttons: the value, its short name, and what it means.
MODES = [(mode.value, mode.value.replace("_", " "), mode.label) for mode in PoolPolicy.Mode]

# A form posted with errors, keyed by its kind and pool: the page shows it instead of a new one.
Bound = dict[tuple[str, str], forms.Form]


def _deployment(request: HttpRequest, name: str, role: Role = Role.VIEWER) -> Deployment:
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)
    require(request.user, deployment.team_id, role)
    return deployment


def _pool(deployment: Deployment, role: str) -> str:
    if role not in services.pool_roles(deployment):
        raise Http404(f"{deployment.name} has no {role} pool")
    return role


def _policy_form(role: str, policy: PoolPolicy | None) -> PolicyForm:
    initial = {name: getattr(policy, name) for name in services.EDITABLE} if policy else {}
    return PolicyForm(initial=initial, auto_id=f"{role}-%s")


def _page(request: HttpRequest, deployment: Deployment, bound: Bound | None = None,
          status: int = 200) -> HttpResponse:
    bound = bound or {}
    pools = [{**state,
              "policy_form": bound.get(("policy", state["role"]))
              or _policy_form(state["role"], state["policy"]),
              "mode_form": bound.get(("mode", state["role"]))}
             for state in pool_states(deployment)]
    since = timezone.now() - timedelta(seconds=READINGS_KEPT_S)
    readings = PoolReading.objects.filter(deployment=deployment, at__gte=since)
    decisions = ScalingDecision.objects.filter(deployment=deployment)[:DECISIONS_SHOWN]
    return render(request, "autoscaling/page.html", {
        "deployment": deployment, "pools": pools, "modes": MODES,
        "decisions_shown": DECISIONS_SHOWN,
        "data": {"readings": [reading_data(r) for r in readings],
                 "decisions": [decision_data(d) for d in decisions]},
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR),
    }, status=status)


@login_required
@require_GET
def autoscaling_page(request: HttpRequest, name: str) -> HttpResponse:
    return _page(request, _deployment(request, name))


def _save(request: HttpRequest, deployment: Deployment, role: str, kind: str,
          form: forms.Form, values: dict[str, Any], partial: bool) -> HttpResponse:
    try:
        services.save_policy(deployment, role, values, partial=partial)
    except ValidationError as exc:
        add_errors(form, exc)
        return _page(request, deployment, {(kind, role): form}, status=400)
    return redirect("autoscaling", name=deployment.name)


@login_required
@require_POST
def policy_mode(request: HttpRequest, name: str, role: str) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    role = _pool(deployment, role)
    form = ModeForm(request.POST, auto_id=f"{role}-mode-%s")
    if not form.is_valid():
        return _page(request, deployment, {("mode", role): form}, status=400)
    return _save(request, deployment, role, "mode", form, {"mode": form.cleaned_data["mode"]},
                 partial=True)


@login_required
@require_POST
def policy_edit(request: HttpRequest, name: str, role: str) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    role = _pool(deployment, role)
    form = PolicyForm(request.POST, auto_id=f"{role}-%s")
    if not form.is_valid():
        return _page(request, deployment, {("policy", role): form}, status=400)
    return _save(request, deployment, role, "policy", form, form.values(), partial=False)
