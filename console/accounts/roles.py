"""Who may do what to a team's objects. A superuser holds every role in every team; anyone
else holds the role of their membership, or none (an outsider, who sees nothing of the team)."""

from __future__ import annotations

from typing import TypeVar

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, QuerySet

from console.accounts.models import DEFAULT_TEAM, Membership, Role, Team

User = AbstractBaseUser | AnonymousUser
M = TypeVar("M", bound=Model)
# Cached on the user object for the length of one request: one query however many checks.
_CACHE = "_pdserve_roles"


def roles_of(user: User) -> dict[int, Role]:
    """{team id: role} of a signed-in user who is no superuser."""
    if not user.is_authenticated:
        return {}
    cached: dict[int, Role] | None = getattr(user, _CACHE, None)
    if cached is None:
        cached = {team: Role(role) for team, role in
                  Membership.objects.filter(user=user).values_list("team_id", "role")}
        setattr(user, _CACHE, cached)
    return cached


def forget_roles(user: User) -> None:
    """Drop the cached roles (after the user's memberships changed)."""
    if hasattr(user, _CACHE):
        delattr(user, _CACHE)


def is_superuser(user: User) -> bool:
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_superuser", False))


def role_in(user: User, team_id: int | None) -> Role | None:
    if is_superuser(user):
        return Role.ADMIN
    if team_id is None or not user.is_authenticated or not user.is_active:
        return None
    return roles_of(user).get(team_id)


def may(user: User, team_id: int | None, role: Role) -> bool:
    held = role_in(user, team_id)
    return held is not None and held.rank >= role.rank


def require(user: User, team_id: int | None, role: Role) -> None:
    """PermissionDenied (403) unless ``user`` holds ``role`` or higher in the team."""
    if not may(user, team_id, role):
        raise PermissionDenied(f"this needs the {role.value} role in the team")


def visible_teams(user: User) -> QuerySet[Team]:
    if is_superuser(user):
        return Team.objects.all()
    return Team.objects.filter(pk__in=list(roles_of(user)))


def visible(queryset: QuerySet[M], user: User, team_field: str = "team") -> QuerySet[M]:
    """The part of ``queryset`` whose team the user belongs to (all of it for a superuser)."""
    if is_superuser(user):
        return queryset
    return queryset.filter(**{f"{team_field}__in": list(roles_of(user))})


def default_team() -> Team:
    team, _ = Team.objects.get_or_create(name=DEFAULT_TEAM,
                                         defaults={"description": "the team make up creates"})
    return team


def team_to_create_in(user: User, team: Team | None, role: Role) -> Team:
    """The team a new object goes to: ``team`` if the user holds ``role`` there (else 403), or,
    when none is named, the one team where they do. ValidationError (keyed ``team``) when that
    is ambiguous."""
    if team is not None:
        require(user, team.pk, role)
        return team
    candidates = [t for t in visible_teams(user) if may(user, t.pk, role)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise PermissionDenied(f"this needs the {role.value} role in a team")
    raise ValidationError({"team": f"name the team: you are {role.value} in "
                                   f"{', '.join(t.name for t in candidates)}"})


def default_team_id() -> int:
    """The default team's id: what a deployment or key made without naming a team gets."""
    return default_team().pk
