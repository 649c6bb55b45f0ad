from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.accounts.models import Role, Team
from console.accounts.roles import may, require, visible, visible_teams
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.aliases import create_alias, delete_alias
from console.gateway.budgets import renews_at, spend
from console.gateway.forms import ApiKeyForm, ModelAliasForm, UsageFilterForm
from console.gateway.models import ApiKey, ModelAlias, TeamBudget, UsageDay
from console.gateway.routes_config import states
from console.gateway.services import KEY_SETTINGS, create_key, revoke_key, scope_errors
from console.gateway.usage import aggregate, latency_ms_avg
from console.supervisor.models import ManagedProcess


def _operator_teams(request: HttpRequest) -> list[Team]:
    return [t for t in visible_teams(request.user) if may(request.user, t.pk, Role.OPERATOR)]


def _render(request: HttpRequest, form: ApiKeyForm | None = None, created: ApiKey | None = None,
            secret: str = "", status: int = 200) -> HttpResponse:
    keys = list(visible(ApiKey.objects.select_related("created_by", "team").prefetch_related(
        "deployments"), request.user))
    teams = _operator_teams(request)
    budgets = list(visible(TeamBudget.objects.select_related("team").order_by("team__name"),
                           request.user))
    spent = spend([key for key in keys if key.budget_tokens is not None], budgets)
    rows = [(key, spent.key(key.pk) if key.budget_tokens is not None else None,
             renews_at(spent.periods[key.budget_period])) for key in keys]
    team_budgets = [(budget, spent.team(budget.team_id),
                     renews_at(spent.periods[budget.period])) for budget in budgets]
    return render(request, "gateway/keys.html", {
        "keys": rows, "team_budgets": team_budgets,
        "form": form or ApiKeyForm(user=request.user, teams=teams),
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
                             limits={field: data.get(field) for field in KEY_SETTINGS},
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


def _replicas() -> list[tuple[str, str, ManagedProcess | None]]:
    """Each replica's slot, address and process row (None until the supervisor starts it)."""
    rows = {row.slot: row for row in ManagedProcess.objects.filter(kind=ManagedProcess.Kind.GATEWAY)}
    return [(gateway_process.slot(replica), gateway_process.url(replica),
             rows.get(gateway_process.slot(replica))) for replica in gateway_process.replicas()]


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
        "replicas": _replicas() if gateway_process.enabled() else [],
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


# The page opens on the last 30 days; an empty "From" shows every day stored.
USAGE_DAYS = 30
# The table's groups: no-key requests of two teams stay apart.
USAGE_TABLE = ["team", "key", "model"]
# The page's filters (the API also takes deployment and group_by).
PAGE_FILTERS = ("team", "key", "model", "since", "until")


@login_required
@require_GET
def usage(request: HttpRequest) -> HttpResponse:
    """Usage of the reader's teams: filters, a chart of tokens per day and a table per key and
    model (static/gateway/usage.js redraws both from the API every 10 s)."""
    query = request.GET.copy()
    if "since" not in query and "until" not in query:
        query["since"] = (datetime.now(UTC).date() - timedelta(days=USAGE_DAYS - 1)).isoformat()
    form = UsageFilterForm(query, user=request.user)
    fields = [form[name] for name in PAGE_FILTERS]
    if not form.is_valid():
        return render(request, "gateway/usage.html", {"form": form, "fields": fields},
                      status=400)
    rows = list(aggregate(form.filter(visible(UsageDay.objects.all(), request.user)),
                          USAGE_TABLE))
    for row in rows:
        row["latency_ms_avg"] = latency_ms_avg(row)
    filters = urlencode(form.query())
    return render(request, "gateway/usage.html", {
        "form": form, "fields": fields, "rows": rows, "filters": filters,
        "api": reverse("usage-list"), "export": f"{reverse('usage-export')}?{filters}",
    })
