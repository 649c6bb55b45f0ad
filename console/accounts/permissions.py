"""DRF permissions: who may call an endpoint. Every viewset of the console names one of these
(tests/console/test_permissions_generated.py walks the URL list and holds each to it)."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.roles import is_superuser, may, roles_of


def _signed_in(request: Request) -> bool:
    return bool(request.user and request.user.is_authenticated and request.user.is_active)


def required_role(view: APIView, request: Request) -> Role:
    """The role the view's action needs: ``team_roles[action]``, else viewer to read and admin
    to change."""
    declared: dict[str, Role] = getattr(view, "team_roles", {})
    action = getattr(view, "action", None) or request.method.lower()
    if action in declared:
        return declared[action]
    return Role.VIEWER if request.method in SAFE_METHODS else Role.ADMIN


class TeamRole(BasePermission):
    """Objects of a team: the view's queryset shows only the user's teams (an outsider gets
    404), and an action needs the role ``required_role`` names in the object's team (else 403).
    A create needs that role in some team here; the view checks the body's team."""

    message = "your role in this team does not allow this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not _signed_in(request):
            return False
        if getattr(view, "action", None) != "create" or is_superuser(request.user):
            return True
        needed = required_role(view, request)
        return any(role.rank >= needed.rank for role in roles_of(request.user).values())

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        team_of = getattr(view, "team_id_of", None)
        team_id = team_of(obj) if team_of is not None else obj.team_id
        return may(request.user, team_id, required_role(view, request))


class SuperuserChanges(BasePermission):
    """Shared objects (nodes, models, variants, teams): anyone signed in reads them, only a
    superuser changes them."""

    message = "only a superuser may change this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not _signed_in(request):
            return False
        return request.method in SAFE_METHODS or is_superuser(request.user)


class SuperuserOnly(BasePermission):
    """Users and other console-wide settings: a superuser's alone."""

    message = "only a superuser may do this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _signed_in(request) and is_superuser(request.user)


class SuperuserOnObject(BasePermission):
    """An object everyone who can see it finds, that only a superuser acts on: those who cannot
    see it get 404 from the view's queryset before this says 403."""

    message = "only a superuser may do this"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return _signed_in(request)

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        return is_superuser(request.user)
