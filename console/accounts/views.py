from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts import services
from console.accounts.forms import MemberForm, NewUserForm, RoleForm, TeamForm
from console.accounts.models import Membership, Role, Team
from console.accounts.roles import is_superuser, require, role_in, roles_of, visible_teams

PAGE_SIZE = 50


def _superuser(request: HttpRequest) -> None:
    if not is_superuser(request.user):
        raise PermissionDenied("only a superuser may do this")


def _team(request: HttpRequest, name: str, role: Role = Role.VIEWER) -> Team:
    """The team if the user is in it (else 404) with at least ``role`` there (else 403)."""
    team = get_object_or_404(visible_teams(request.user), name=name)
    require(request.user, team.pk, role)
    return team


def _teams_page(request: HttpRequest, form: TeamForm | None = None,
                status: int = 200) -> HttpResponse:
    teams = visible_teams(request.user).annotate(member_count=Count("memberships"))
    held = roles_of(request.user)
    return render(request, "accounts/teams.html", {
        "teams": [(team, held.get(team.pk)) for team in teams],
        "form": form or TeamForm(), "can_create": is_superuser(request.user),
    }, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def teams(request: HttpRequest) -> HttpResponse:
    """The teams one is in; a superuser POSTs a new one here (not under /teams/<name>/, where
    any slug is a team's)."""
    if request.method == "GET":
        return _teams_page(request)
    _superuser(request)
    form = TeamForm(request.POST)
    if not form.is_valid():
        return _teams_page(request, form, status=400)
    team = services.create_team(**form.cleaned_data)
    return redirect("team-page", name=team.name)


def _team_page(request: HttpRequest, team: Team, *, status: int = 200, refused: str = "",
               **forms: Any) -> HttpResponse:
    held = role_in(request.user, team.pk)
    members = team.memberships.select_related("user").order_by("user__username")
    return render(request, "accounts/team.html", {
        "team": team, "role": held, "members": members, "roles": Role.choices,
        "can_admin": held == Role.ADMIN, "can_delete": is_superuser(request.user),
        "team_form": forms.get("team_form") or TeamForm(instance=team),
        "member_form": forms.get("member_form") or MemberForm(),
        "refused": refused,
    }, status=status)


@login_required
@require_GET
def team_page(request: HttpRequest, name: str) -> HttpResponse:
    return _team_page(request, _team(request, name))


@login_required
@require_POST
def team_edit(request: HttpRequest, name: str) -> HttpResponse:
    team = _team(request, name, Role.ADMIN)
    form = TeamForm(request.POST, instance=Team.objects.get(pk=team.pk))
    if not form.is_valid():
        return _team_page(request, team, status=400, team_form=form)
    try:
        team = services.edit_team(team, form.cleaned_data)
    except services.Conflict as exc:
        return _team_page(request, team, status=409, refused=str(exc))
    return redirect("team-page", name=team.name)


@login_required
@require_POST
def team_delete(request: HttpRequest, name: str) -> HttpResponse:
    team = _team(request, name)
    _superuser(request)
    try:
        services.delete_team(team)
    except services.Conflict as exc:
        return _team_page(request, team, status=409, refused=str(exc))
    return redirect("teams")


@login_required
@require_POST
def member_add(request: HttpRequest, name: str) -> HttpResponse:
    team = _team(request, name, Role.ADMIN)
    form = MemberForm(request.POST)
    if not form.is_valid():
        return _team_page(request, team, status=400, member_form=form)
    try:
        services.add_member(team, form.cleaned_data["user"], Role(form.cleaned_data["role"]))
    except services.Conflict as exc:
        return _team_page(request, team, status=409, refused=str(exc), member_form=form)
    return redirect("team-page", name=team.name)


def _member(request: HttpRequest, name: str, user_id: int) -> tuple[Team, Membership]:
    team = _team(request, name, Role.ADMIN)
    return team, get_object_or_404(Membership.objects.select_related("team", "user"),
                                   team=team, user_id=user_id)


@login_required
@require_POST
def member_role(request: HttpRequest, name: str, user_id: int) -> HttpResponse:
    team, member = _member(request, name, user_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _team_page(request, team, status=400, refused=f"role: {form.errors['role'][0]}")
    try:
        services.change_role(member, Role(form.cleaned_data["role"]))
    except services.Conflict as exc:
        return _team_page(request, team, status=409, refused=str(exc))
    return redirect("team-page", name=team.name)


@login_required
@require_POST
def member_remove(request: HttpRequest, name: str, user_id: int) -> HttpResponse:
    team, member = _member(request, name, user_id)
    try:
        services.remove_member(member)
    except services.Conflict as exc:
        return _team_page(request, team, status=409, refused=str(exc))
    return redirect("team-page", name=team.name)


def _users_page(request: HttpRequest, form: NewUserForm | None = None, *, status: int = 200,
                refused: str = "") -> HttpResponse:
    page = Paginator(get_user_model().objects.order_by("username"), PAGE_SIZE).get_page(
        request.GET.get("page"))
    return render(request, "accounts/users.html", {
        "page": page, "form": form or NewUserForm(), "refused": refused}, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def users(request: HttpRequest) -> HttpResponse:
    """Every user; a POST creates one (superusers only)."""
    _superuser(request)
    if request.method == "GET":
        return _users_page(request)
    form = NewUserForm(request.POST)
    if not form.is_valid():
        return _users_page(request, form, status=400)
    data = dict(form.cleaned_data)
    services.create_user(data.pop("username"), data.pop("password"), **data)
    return redirect("users")


def _set_active(request: HttpRequest, pk: int, active: bool) -> HttpResponse:
    _superuser(request)
    user = get_object_or_404(get_user_model(), pk=pk)
    try:
        services.edit_user(user, {"is_active": active}, by=request.user)
    except services.Conflict as exc:
        return _users_page(request, status=409, refused=str(exc))
    return redirect("users")


@login_required
@require_POST
def user_deactivate(request: HttpRequest, pk: int) -> HttpResponse:
    return _set_active(request, pk, False)


@login_required
@require_POST
def user_activate(request: HttpRequest, pk: int) -> HttpResponse:
    return _set_active(request, pk, True)
