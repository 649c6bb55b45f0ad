from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role, Team
from console.accounts.roles import may, require, visible, visible_teams
from console.gateway.forms import ApiKeyForm
from console.gateway.models import LIMIT_FIELDS, ApiKey
from console.gateway.services import create_key, revoke_key, scope_errors


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
