"""The audit log: one append-only entry per change, made through a page, the API, a management
command or the supervise daemon.

Entries name their object by type, id and text rather than by foreign key, so that they outlive
it: deleting a deployment keeps the entries that say who made, ran and deleted it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from django.conf import settings
from django.db import models
from django.utils import timezone


class AppendOnly(Exception):
    """Raised on any attempt to change or delete an entry."""


class EntryQuerySet(models.QuerySet["AuditEntry"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise AppendOnly("audit entries are append-only")

    def delete(self) -> NoReturn:  # type: ignore[override]
        raise AppendOnly("audit entries are append-only")


class AuditEntry(models.Model):
    class Actor(models.TextChoices):
        USER = "user"            # signed in to a page, or a session on the API
        TOKEN = "token"          # a user's API token
        COMMAND = "command"      # a management command run on the console's host
        SYSTEM = "system"        # the supervise daemon and other background work

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=16, choices=Actor.choices)
    # PROTECT: a user with entries is deactivated, never deleted (deleting would have to
    # change the entries, which are append-only); the admin says so instead of failing.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                             on_delete=models.PROTECT, related_name="+")
    # Kept as text too, as written at the time.
    username = models.CharField(max_length=150, blank=True)
    # The public prefix of the API token used, or the command's or daemon's name.
    via = models.CharField(max_length=100, blank=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64, db_index=True)
    object_id = models.CharField(max_length=64, blank=True, db_index=True)
    object_repr = models.CharField(max_length=200, blank=True)
    # The team that owns the object, by id: members see their team's entries.
    team_id = models.PositiveIntegerField(null=True, blank=True, db_index=True)
    # {field: [before, after]}, secrets masked.
    changes = models.JSONField(default=dict, blank=True)

    objects = EntryQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-pk"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.who} {self.action} {self.object_repr}"

    @property
    def who(self) -> str:
        if self.actor == self.Actor.TOKEN:
            return f"{self.username} (token {self.via})"
        if self.actor in (self.Actor.COMMAND, self.Actor.SYSTEM):
            return f"{self.actor}:{self.via}" + (f" as {self.username}" if self.username else "")
        return self.username

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnly("audit entries are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise AppendOnly("audit entries are append-only")
