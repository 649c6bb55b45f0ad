"""API tokens: made with a secret shown once, found by the secret's hash, refused once expired or
revoked, and their last use written at most once a minute. Making and revoking one is audited."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from console.audit.entries import record, snapshot
from console.credentials.models import ApiToken

log = logging.getLogger(__name__)

# Marks a console API token, so a secret found in a log or a repository says what it opens.
SECRET_START = "pdt_"
PREFIX_LENGTH = len(SECRET_START) + 8
# Last use is bookkeeping: one write a minute per token, not one per API call.
LAST_USE_RESOLUTION = timedelta(minutes=1)
AUDITED_FIELDS = ("user", "name", "prefix", "expires_at", "revoked_at")


class TokenRefused(Exception):
    """The secret opens nothing; the message says why, for the 401 answer."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(user: AbstractBaseUser, name: str,
                 lifetime_days: int | None = None) -> tuple[ApiToken, str]:
    """A new token of ``user`` and its secret, which is not stored and cannot be shown again."""
    days = settings.PDSERVE_API_TOKEN_DAYS if lifetime_days is None else lifetime_days
    if not 1 <= days <= settings.PDSERVE_API_TOKEN_MAX_DAYS:
        raise ValueError(f"lifetime_days: {days} is not within 1..{settings.PDSERVE_API_TOKEN_MAX_DAYS}")
    # 32 random bytes: a hash collision or a guess is out of reach, so no retry on the unique hash.
    secret = SECRET_START + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name, prefix=secret[:PREFIX_LENGTH], secret_hash=hash_secret(secret),
            expires_at=timezone.now() + timedelta(days=days))
        record("api_token.create", token, after=snapshot(token, AUDITED_FIELDS))
    return token, secret


def revoke_token(token: ApiToken) -> ApiToken:
    """Refused from the next call on; revoking twice keeps the first time and records once."""
    with transaction.atomic():
        locked = ApiToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is None:
            before = snapshot(locked, AUDITED_FIELDS)
            locked.revoked_at = timezone.now()
            locked.save(update_fields=["revoked_at"])
            record("api_token.revoke", locked, before=before,
                   after=snapshot(locked, AUDITED_FIELDS))
    return locked


def accepted_token(secret: str, now: datetime) -> ApiToken:
    """The token ``secret`` opens, its user loaded; raises TokenRefused saying why not."""
    token = (ApiToken.objects.select_related("user")
             .filter(secret_hash=hash_secret(secret)).first())
    if token is None:
        raise TokenRefused("Invalid token.")
    if token.revoked_at is not None:
        raise TokenRefused(f"Token {token.prefix}… was revoked at {token.revoked_at:%Y-%m-%d %H:%M} UTC.")
    if token.expires_at <= now:
        raise TokenRefused(f"Token {token.prefix}… expired at {token.expires_at:%Y-%m-%d %H:%M} UTC; "
                           "make a new one (POST /api/v1/auth/token).")
    if not token.user.is_active:
        raise TokenRefused("User inactive or deleted.")
    return token


def note_use(token: ApiToken, now: datetime) -> None:
    """Remember ``now`` as the token's last use, unless a use under a minute ago already is.

    The note never fails the call it is made for: when another writer holds the database
    for longer than LAST_USE_LOCK_WAIT (the supervisor promoting a rollout on a saturated
    host), the note is left for the next call and a warning logged; a GET answered 500
    "database is locked" for bookkeeping is what this avoids."""
    stale = now - LAST_USE_RESOLUTION
    if token.last_used_at is not None and token.last_used_at > stale:
        return
    try:
        with _brief_lock_wait():
            # Conditional, so concurrent calls of one token write once between them.
            ApiToken.objects.filter(pk=token.pk).filter(
                Q(last_used_at__isnull=True) | Q(last_used_at__lte=stale)).update(last_used_at=now)
    except OperationalError as busy:
        log.warning("token %s: its last use is not recorded this time, the database is "
                    "busy (%s)", token.prefix, busy)
        return
    token.last_used_at = now


# How long the last-use note waits for another writer's lock before it is left out.
LAST_USE_LOCK_WAIT = timedelta(seconds=1)


@contextlib.contextmanager
def _brief_lock_wait() -> Iterator[None]:
    """The statements inside wait at most LAST_USE_LOCK_WAIT for a lock (SQLite's busy
    timeout, PostgreSQL's lock_timeout) instead of the connection's own limit."""
    wait_ms = int(LAST_USE_LOCK_WAIT.total_seconds() * 1000)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            (before,) = cursor.fetchone()
            cursor.execute(f"PRAGMA busy_timeout = {wait_ms}")
            try:
                yield
            finally:
                cursor.execute(f"PRAGMA busy_timeout = {int(before)}")
    elif connection.vendor == "postgresql":
        # SET LOCAL ends with the transaction; the savepoint keeps a refused lock from
        # aborting a transaction the caller may be in.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {wait_ms}")
            yield
    else:
        yield
