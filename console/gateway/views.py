from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role, Team
from console.accounts.roles import may, require, visible, visible_teams
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.aliases import create_alias, delete_alias
from console.gateway.forms import ApiKeyForm, ModelAliasForm
from console.gateway.models import LIMIT_FIELDS, ApiKey, ModelAlias
from console.gateway.routes_config import states
from console.gateway.services import create_key, revoke_key, scope_errors
from console.supervisor.models import ManagedProcess


def _operator_teams(request: HttpRequest) -> list[Team]:
    return [t for t in visible_teams(request.user) if may(request.user, t.pk, Role.OPERATOR)]


def _render(request: HttpRequest, form: ApiKeyForm | None = None, created: ApiKey | None = None,
            secret: str = "", status: int = 200) -> HttpResponse:
    keys = visible(ApiKey.objects.select_related("created_by", "team").prefetch_related(
        "deployments"), request.user)
    teams = _operator_teams(request)
    return render(request, "gateway/keys.html", {
        "keys": keys, "form": form or ApiKeyForm(user=request.user, teams=teams),
        "created": created, "secret": secret, "can_operate": bool(teams),
        "operated": {t.pk for t in teams},
    }, status=status)


@login_required
@require_GET
def keys(request: HttpRequest) -> HttpResponse:
    return _render(request)


@login_required
@require_POST
def key_new(request: HttpRequest) -> HttpResponse:
    teams = _operator_teams(request)
    if not teams:
        raise PermissionDenied("making a key needs the operator role in a team")
    form = ApiKeyForm(request.POST, user=request.user, teams=teams)
    if not form.is_valid():
        return _render(request, form, status=400)
    data = form.cleaned_data
    for field, message in scope_errors(data["team"], data["deployments"]).items():
        form.add_error(field, message)
    if form.errors:
        return _render(request, form, status=400)
    key, secret = create_key(name=data["name"], team=data["team"], deployments=data["deployments"],
                             all_deployments=data["all_deployments"],
                             limits={field: data.get(field) for field in LIMIT_FIELDS},
                             user=request.user)
    # Rendered, not redirected: this answer is the only place the key ever appears, and a
    # reload must not show it again.
    response = _render(request, created=key, secret=secret, status=201)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(visible(ApiKey.objects.all(), request.user), pk=pk)
    require(request.user, key.team_id, Role.OPERATOR)
    revoke_key(key)
    return redirect("keys")


def _render_gateway(request: HttpRequest, form: ModelAliasForm | None = None,
                    status: int = 200) -> HttpResponse:
    teams = _operator_teams(request)
    deployments = list(visible(Deployment.objects.select_related("team").order_by("name"),
                               request.user))
    state_of = states(deployments)
    aliases = visible(ModelAlias.objects.select_related("team").prefetch_related(
        "targets__deployment"), request.user)
    served = set(Deployment.objects.values_list("served_model_name", flat=True))
    return render(request, "gateway/gateway.html", {
        "enabled": gateway_process.enabled(),
        "url": gateway_process.url() if gateway_process.enabled() else "",
        "process": ManagedProcess.objects.filter(kind=ManagedProcess.Kind.GATEWAY).first(),
        "models": [(d, state_of[d.name]) for d in deployments],
        "aliases": [(alias, alias.name in served) for alias in aliases],
        "form": form or ModelAliasForm(user=request.user, teams=teams),
        "can_operate": bool(teams), "operated": {t.pk for t in teams},
    }, status=status)


@login_required
@require_GET
def gateway(request: HttpRequest) -> HttpResponse:
    return _render_gateway(request)


@login_required
@require_POST
def alias_new(request: HttpRequest) -> HttpResponse:
    teams = _operator_teams(request)
    if not teams:
        raise PermissionDenied("making an alias needs the operator role in a team")
    form = ModelAliasForm(request.POST, user=request.user, teams=teams)
    if not form.is_valid():
        return _render_gateway(request, form, status=400)
    data = form.cleaned_data
    try:
        create_alias(name=data["name"], team=data["team"], targets=data["targets"],
                     user=request.user)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            form.add_error(field, messages)
        return _render_gateway(request, form, status=400)
    return redirect("gateway")


@login_required
@require_POST
def alias_delete(request: HttpRequest, pk: int) -> HttpResponse:
    alias = get_object_or_404(visible(ModelAlias.objects.all(), request.user), pk=pk)
    require(request.user, alias.team_id, Role.OPERATOR)
    delete_alias(alias)
    return redirect("gateway")
