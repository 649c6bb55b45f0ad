"""The topology advice page of a deployment: the load chosen, the candidates ranked, the
measurement's progress, and the one click that rolls the recommendation out."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role
from console.accounts.roles import may, require, visible
from console.advisor import services, speed_runs, topology_drafts
from console.advisor.forms import LoadForm
from console.advisor.load_sources import LoadUnavailable
from console.advisor.predictions import subject
from console.deployments.models import Deployment
from console.rollouts.models import Rollout


def _deployment(request: HttpRequest, name: str) -> Deployment:
    return get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)


def _refused(request: HttpRequest, deployment: Deployment, action: str, reason: str,
             code: int) -> HttpResponse:
    return render(request, "quality/refused.html", {
        "deployment": deployment, "action": action, "reason": reason}, status=code)


@login_required
@require_GET
def advice_page(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    form = LoadForm(request.GET or None)
    advice, problem = None, ""
    # Read before the advice: a measurement shown done is then one the advice has seen.
    measurement = services.latest_measurement(deployment)
    if form.is_bound and not form.is_valid():
        problem = form.errors.as_text()
    else:
        if not form.is_bound:
            form = LoadForm({"window": "hour"})
            form.is_valid()
        try:
            advice = services.advice_for(deployment, form)
        except LoadUnavailable as exc:
            problem = str(exc)
    return render(request, "advisor/advice.html", {
        "deployment": deployment, "form": form, "advice": advice, "problem": problem,
        "query": request.GET.urlencode(), "strategies": Rollout.Strategy.choices,
        "measurement": measurement,
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR)})


@login_required
@require_GET
def measurement_panel(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    return render(request, "advisor/_measurement.html", {
        "deployment": deployment, "measurement": services.latest_measurement(deployment)})


@login_required
@require_POST
def measure(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    require(request.user, deployment.team_id, Role.OPERATOR)
    found = subject(deployment)
    if found is None:
        return _refused(request, deployment, "Measure", "the plan has no workers", 409)
    try:
        speed_runs.queue(found.node, found.variant, request.user)
    except speed_runs.MeasureRefused as exc:
        return _refused(request, deployment, "Measure", str(exc), 409)
    return redirect("topology-advice", name=deployment.name)


@login_required
@require_POST
def apply(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name)
    require(request.user, deployment.team_id, Role.OPERATOR)
    form = LoadForm(request.POST)
    strategy = request.POST.get("strategy") or Rollout.Strategy.BLUE_GREEN
    if strategy not in Rollout.Strategy.values:
        return _refused(request, deployment, "Apply the advice", f"strategy: unknown {strategy!r}", 400)
    if not form.is_valid():
        return _refused(request, deployment, "Apply the advice", form.errors.as_text(), 400)
    try:
        advice = services.advice_for(deployment, form)
        _revision, rollout = topology_drafts.apply(deployment, advice, request.user, strategy)
    except LoadUnavailable as exc:
        return _refused(request, deployment, "Apply the advice", str(exc), 400)
    except topology_drafts.ApplyRefused as exc:
        return _refused(request, deployment, "Apply the advice", str(exc), 409)
    return redirect("rollout", pk=rollout.pk)
