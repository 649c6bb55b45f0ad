"""Whose entries a user may read: a superuser all of them; anyone else the entries of their
teams' objects and the entries of their own changes.

The audit app sits below accounts (every app, accounts included, records entries), so a user's
teams are read through the ``memberships`` relation accounts adds to the user model, as one
subquery, rather than by importing accounts."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q, QuerySet

from console.audit.models import AuditEntry


def visible_entries(user: AbstractBaseUser | AnonymousUser) -> QuerySet[AuditEntry]:
    entries = AuditEntry.objects.select_related("user")
    if not user.is_authenticated or not user.is_active:
        return entries.none()
    if getattr(user, "is_superuser", False):
        return entries
    teams = user.memberships.values("team_id")  # type: ignore[union-attr]
    return entries.filter(Q(team_id__in=teams) | Q(user=user))
