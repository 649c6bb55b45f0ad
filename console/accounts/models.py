"""Teams and their members' roles. A deployment, its keys, alert rules and rollouts belong to a
team; what a user may do to them is the role they hold in that team (``roles.py``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

DEFAULT_TEAM = "default"


class Role(models.TextChoices):
    # In rising order: each role may do what the ones before it may.
    VIEWER = "viewer", "viewer: sees the team's deployments, logs and metrics, no secrets"
    OPERATOR = "operator", "operator: also starts and stops, runs gates, makes keys"
    ADMIN = "admin", "admin: also edits plans and the team's members"

    @property
    def rank(self) -> int:
        return list(Role).index(self)


class Team(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership",
                                     related_name="teams")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"],
                                               name="membership_unique_member")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} as {self.role}"
