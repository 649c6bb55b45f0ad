"""The revision list of a deployment and the rollout page; rollout.js keeps the latter live over
the deployment's socket."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role
from console.accounts.roles import may, require, visible
from console.deployments.models import Deployment
from console.rollouts import green_progress, revisions, services
from console.rollouts.api.serializers import RolloutSerializer
from console.rollouts.forms import DraftForm, StartForm
from console.rollouts.machine import TransitionRefused
from console.rollouts.models import Revision, Rollout
from console.rollouts.rollout_socket import rollout_state

State = Rollout.State
# Which buttons a state offers (the script shows and hides them as the state changes).
BUTTON_STATES: dict[str, tuple[str, ...]] = {
    "pause": (State.STARTING, State.GATING, State.STEPPING, State.WARM),
    "resume": (State.PAUSED,),
    "promote": (State.STEPPING, State.PAUSED),
    "rollback": (State.STARTING, State.GATING, State.STEPPING, State.PAUSED, State.WARM),
}
MOVERS = {"pause": services.pause, "resume": services.resume, "promote": services.promote}


def _deployment(request: HttpRequest, name: str, role: Role = Role.VIEWER) -> Deployment:
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), name=name)
    require(request.user, deployment.team_id, role)
    return deployment


def _rollout(request: HttpRequest, pk: int, role: Role = Role.VIEWER) -> Rollout:
    rollout = get_object_or_404(visible(Rollout.objects.select_related(
        "deployment", "from_revision", "to_revision", "created_by"), request.user,
        "deployment__team"), pk=pk)
    require(request.user, rollout.deployment.team_id, role)
    return rollout


def _revisions_page(request: HttpRequest, deployment: Deployment, *, draft_form: DraftForm,
                    refused: str = "", status: int = 200) -> HttpResponse:
    rows = list(Revision.objects.filter(deployment=deployment).select_related("created_by"))
    specs = {r.number: r.spec for r in rows}
    listed = []
    for revision in rows:
        earlier = [n for n in specs if n < revision.number]
        listed.append({"revision": revision,
                       "changes": revisions.diff(specs[max(earlier)], revision.spec)
                       if earlier else None})
    return render(request, "rollouts/revisions.html", {
        "deployment": deployment, "rows": listed, "draft_form": draft_form,
        "start_form": StartForm(), "refused": refused,
        "default_deadline": green_progress.default_deadline(deployment.pk),
        "active": services.active(deployment),
        "can_operate": may(request.user, deployment.team_id, Role.OPERATOR),
    }, status=status)


@login_required
@require_GET
def revision_list(request: HttpRequest, name: str) -> HttpResponse:
    return _revisions_page(request, _deployment(request, name), draft_form=DraftForm())


@login_required
@require_POST
def revision_new(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    form = DraftForm(request.POST)
    if form.is_valid():
        fields, variants, note = form.draft_input()
        try:
            revision, report = revisions.create_draft(deployment, fields, variants,
                                                      request.user, note)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            failed = "; ".join(outcome.message for outcome in report.errors)
            messages.info(request, f"draft r{revision.number} made; checks "
                          f"{'pass' if report.ok else 'fail: ' + failed}")
            return redirect("revisions", name=name)
    return _revisions_page(request, deployment, draft_form=form, status=400)


@login_required
@require_POST
def revision_rollout(request: HttpRequest, name: str, number: int) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    revision = get_object_or_404(Revision, deployment=deployment, number=number)
    form = StartForm(request.POST)
    if not form.is_valid():
        return _revisions_page(request, deployment, draft_form=DraftForm(), status=400,
                               refused="; ".join(f"{k}: {' '.join(v)}"
                                                 for k, v in form.errors.items()))
    try:
        rollout = services.start(deployment, revision, form.cleaned_data["strategy"],
                                 request.user, steps=form.cleaned_data["steps"],
                                 start_timeout_s=form.cleaned_data["start_timeout_s"],
                                 verify_green=form.cleaned_data["verify_green"])
    except (services.RolloutRefused, ValidationError) as exc:
        text = ("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
                if isinstance(exc, ValidationError) else str(exc))
        return _revisions_page(request, deployment, draft_form=DraftForm(), refused=text,
                               status=409)
    return redirect("rollout", pk=rollout.pk)


@login_required
@require_POST
def deployment_rollback(request: HttpRequest, name: str) -> HttpResponse:
    deployment = _deployment(request, name, Role.OPERATOR)
    try:
        rollout = services.rollback_to_previous(deployment, request.user)
    except services.RolloutRefused as exc:
        return _revisions_page(request, deployment, draft_form=DraftForm(), refused=str(exc),
                               status=409)
    return redirect("rollout", pk=rollout.pk)


def _rollout_context(request: HttpRequest, rollout: Rollout) -> dict[str, Any]:
    data = RolloutSerializer(rollout).data
    latest = data["analyses"][-1] if data["analyses"] else None
    return {
        "rollout": rollout, "deployment": rollout.deployment,
        "data": {**dict(data), "live": rollout_state(rollout)},
        "checks": sorted((latest or {}).get("metrics", {}).items()),
        "latest": latest,
        "transitions": list(rollout.transitions.all()),
        "green_workers": sorted(rollout.progress.get("workers", {}).items()),
        "step": rollout.steps[rollout.step_index] if rollout.step_index < len(rollout.steps)
        else None,
        "blue_weight": rollout.weights.get(rollout.from_revision.label, 0),
        "green_weight": rollout.weights.get(rollout.to_revision.label, 0),
        "can_operate": may(request.user, rollout.deployment.team_id, Role.OPERATOR),
        "buttons": [(name, " ".join(states), rollout.state in states)
                    for name, states in BUTTON_STATES.items()],
    }


@login_required
@require_GET
def rollout_page(request: HttpRequest, pk: int) -> HttpResponse:
    rollout = _rollout(request, pk)
    return render(request, "rollouts/rollout.html", _rollout_context(request, rollout))


def _act(request: HttpRequest, pk: int, name: str) -> HttpResponse:
    rollout = _rollout(request, pk, Role.OPERATOR)
    try:
        if name == "rollback":
            services.rollback(rollout, f"rolled back by {request.user.get_username()}")
        else:
            MOVERS[name](rollout)
    except TransitionRefused as exc:
        context = {**_rollout_context(request, rollout), "refused": str(exc)}
        return render(request, "rollouts/rollout.html", context, status=409)
    return redirect("rollout", pk=pk)


@login_required
@require_POST
def rollout_pause(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "pause")


@login_required
@require_POST
def rollout_resume(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "resume")


@login_required
@require_POST
def rollout_promote(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "promote")


@login_required
@require_POST
def rollout_rollback(request: HttpRequest, pk: int) -> HttpResponse:
    return _act(request, pk, "rollback")
