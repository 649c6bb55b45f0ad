"""Changes to teams, memberships and users, for the pages and the API alike: each checks what
the data alone decides (a team keeps an admin, a superuser stays), makes the change and writes
its one audit entry in the same transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import transaction
from django.db.models import ProtectedError

from console.accounts.models import DEFAULT_TEAM, Membership, Role, Team
from console.accounts.roles import forget_roles
from console.audit.entries import record, snapshot

TEAM_FIELDS = ("name", "description")
MEMBER_FIELDS = ("team", "user", "role")
# What an entry keeps of a user: the password only as the fact that it changed (masked).
USER_FIELDS = ("username", "email", "first_name", "last_name", "is_active", "is_superuser",
               "password")
# What a user's edit may change.
USER_EDITABLE = ("email", "first_name", "last_name", "is_active", "is_superuser", "password")


class Conflict(Exception):
    """The change would leave the console in a state it refuses (answered with 409)."""


def _lock(team: Team) -> None:
    # Two admins demoting each other at once must not both see the other still admin.
    Team.objects.select_for_update().filter(pk=team.pk).first()


def create_team(name: str, description: str = "") -> Team:
    with transaction.atomic():
        team = Team.objects.create(name=name, description=description)
        record("team.create", team, after=snapshot(team, TEAM_FIELDS), team_id=team.pk)
    return team


def edit_team(team: Team, changes: Mapping[str, Any]) -> Team:
    if team.name == DEFAULT_TEAM and changes.get("name", DEFAULT_TEAM) != DEFAULT_TEAM:
        # New deployments and keys that name no team go to the team of this name.
        raise Conflict(f"the {DEFAULT_TEAM} team keeps its name: what names no team goes to it")
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        before = snapshot(team, TEAM_FIELDS)
        for field in TEAM_FIELDS:
            if field in changes:
                setattr(team, field, changes[field])
        team.full_clean()
        team.save()
        record("team.edit", team, before=before, after=snapshot(team, TEAM_FIELDS),
               team_id=team.pk)
    return team


def delete_team(team: Team) -> None:
    members = list(team.members.all())
    try:
        with transaction.atomic():
            before = snapshot(team, TEAM_FIELDS)
            record("team.delete", team, before=before, team_id=team.pk)
            team.delete()
    except ProtectedError as exc:
        owned = sorted({str(obj._meta.verbose_name_plural) for obj in exc.protected_objects})
        raise Conflict(f"team {team.name} still owns {', '.join(owned)}: move or delete them "
                       f"first") from exc
    for user in members:
        forget_roles(user)


def _admins_left(team: Team, without: Membership) -> bool:
    return Membership.objects.filter(team=team, role=Role.ADMIN).exclude(pk=without.pk).exists()


def add_member(team: Team, user: AbstractUser, role: Role) -> Membership:
    if Membership.objects.filter(team=team, user=user).exists():
        raise Conflict(f"{user.get_username()} is already a member of {team.name}: change their "
                       f"role instead")
    with transaction.atomic():
        member = Membership.objects.create(team=team, user=user, role=role)
        record("member.add", member, after=snapshot(member, MEMBER_FIELDS))
    forget_roles(user)
    return member


def change_role(member: Membership, role: Role) -> Membership:
    with transaction.atomic():
        _lock(member.team)
        member = Membership.objects.select_related("team", "user").get(pk=member.pk)
        if member.role == Role.ADMIN and role != Role.ADMIN and not _admins_left(member.team,
                                                                                  member):
            raise Conflict(f"team {member.team.name} must keep an admin: make another member "
                           f"admin before {member.user.get_username()} stops being one")
        before = snapshot(member, MEMBER_FIELDS)
        member.role = role
        member.save(update_fields=["role"])
        record("member.role", member, before=before, after=snapshot(member, MEMBER_FIELDS))
    forget_roles(member.user)
    return member


def remove_member(member: Membership) -> None:
    with transaction.atomic():
        _lock(member.team)
        member = Membership.objects.select_related("team", "user").get(pk=member.pk)
        if member.role == Role.ADMIN and not _admins_left(member.team, member):
            raise Conflict(f"team {member.team.name} must keep an admin: make another member "
                           f"admin before removing {member.user.get_username()}")
        record("member.remove", member, before=snapshot(member, MEMBER_FIELDS))
        member.delete()
    forget_roles(member.user)


def create_user(username: str, password: str, *, is_superuser: bool = False,
                **profile: str) -> AbstractUser:
    """``profile``: email, first_name, last_name."""
    with transaction.atomic():
        user = get_user_model().objects.create_user(
            username=username, password=password, is_superuser=is_superuser,
            # The admin site (the read-only audit log among it) lets in staff only.
            is_staff=is_superuser, **profile)
        record("user.create", user, after=snapshot(user, USER_FIELDS))
    return user


def edit_user(user: AbstractUser, changes: Mapping[str, Any], *, by: AbstractUser) -> AbstractUser:
    """``changes``: any of ``USER_EDITABLE``, the password in clear (it is hashed). The entry's
    action says what mattered most: user.deactivate, user.activate, else user.edit."""
    unknown = set(changes) - set(USER_EDITABLE)
    if unknown:
        raise ValueError(f"edit_user: not editable: {', '.join(sorted(unknown))}")
    with transaction.atomic():
        user = get_user_model().objects.select_for_update().get(pk=user.pk)
        loses_power = (changes.get("is_active") is False
                       or changes.get("is_superuser") is False) and user.is_superuser
        if loses_power and user.pk == by.pk:
            # Then the console always keeps the superuser making the change.
            raise Conflict("you cannot deactivate yourself or give up your own superuser: "
                           "another superuser must")
        before = snapshot(user, USER_FIELDS)
        for field, value in changes.items():
            if field == "password":
                user.set_password(value)
            else:
                setattr(user, field, value)
        if "is_superuser" in changes:
            user.is_staff = user.is_superuser
        user.save()
        action = "user.edit"
        if before["is_active"] != user.is_active:
            action = "user.activate" if user.is_active else "user.deactivate"
        record(action, user, before=before, after=snapshot(user, USER_FIELDS))
    return user
