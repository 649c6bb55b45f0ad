"""API tokens of the console's REST API: each a user's, named, stored only as a SHA-256 hash of
its secret, expiring, revocable, and remembering when it was last used."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        EXPIRED = "expired"
        REVOKED = "revoked"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The secret's first characters, shown in lists and audit entries to tell tokens apart;
    # too short to guess the rest from.
    prefix = models.CharField(max_length=12, editable=False)
    secret_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def state(self, now: datetime) -> ApiToken.State:
        if self.revoked_at is not None:
            return self.State.REVOKED
        return self.State.EXPIRED if self.expires_at <= now else self.State.ACTIVE
