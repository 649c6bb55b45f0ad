"""Who is acting: the request being served (set by ``AuditMiddleware``), or a command or the
daemon that said so with ``acting_as``. ``record`` reads it, so that no caller passes a user
through layers that have no business knowing one."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest, HttpResponse

from console.audit.models import AuditEntry

_request: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar(
    "audit_request", default=None)
_acting: contextvars.ContextVar[Actor | None] = contextvars.ContextVar(
    "audit_acting", default=None)

# The attribute an authentication class sets on the request to the API token it accepted.
TOKEN_ATTRIBUTE = "pdserve_api_token"


@dataclass(frozen=True)
class Actor:
    kind: str
    user: AbstractBaseUser | None = None
    via: str = ""
    address: str | None = None


class AuditMiddleware:
    """Makes the request the actor of the changes made while serving it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


@contextlib.contextmanager
def acting_as(kind: str, via: str, user: AbstractBaseUser | None = None) -> Iterator[None]:
    """Changes made inside are the command's or the daemon's (``kind``: command or system)."""
    if kind not in (AuditEntry.Actor.COMMAND, AuditEntry.Actor.SYSTEM):
        raise ValueError(f"acting_as: kind must be command or system, not {kind!r}")
    token = _acting.set(Actor(kind=kind, user=user, via=via))
    try:
        yield
    finally:
        _acting.reset(token)


def _address(request: HttpRequest) -> str | None:
    # REMOTE_ADDR, never a forwarded header a client can write: behind a TLS proxy the proxy's
    # address is what the console can vouch for.
    return request.META.get("REMOTE_ADDR") or None


def current_actor() -> Actor:
    acting = _acting.get()
    if acting is not None:
        return acting
    request = _request.get()
    if request is None:
        # Outside a request and outside acting_as: a script or shell on the console's host.
        return Actor(kind=AuditEntry.Actor.COMMAND, via=Path(sys.argv[0]).name)
    user = getattr(request, "user", None)
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        user = None
    api_token = getattr(request, TOKEN_ATTRIBUTE, None)
    if api_token is not None:
        return Actor(kind=AuditEntry.Actor.TOKEN, user=user, via=str(api_token.prefix),
                     address=_address(request))
    return Actor(kind=AuditEntry.Actor.USER, user=user, address=_address(request))
