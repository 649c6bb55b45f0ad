"""Login rate limiting by django-axes: the authentication backend that refuses a locked-out
login, the client address failures are counted by, and the answer a locked-out login gets
(JSON on the API, a page otherwise). What a lockout covers is settings.PDSERVE_LOGIN_LOCKOUT."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

LOCKED_OUT_STATUS = 429
# What the lockout answer says is locked, by settings.PDSERVE_LOGIN_LOCKOUT.
LOCKED_SCOPE = {
    "user-at-address": "for this user from this address",
    "user": "for this user",
    "user-or-address": "for this user or from this address",
}


class LoginRateLimitBackend(AxesStandaloneBackend):
    """Axes' check, before the password backend; a login without a request is let through.

    Without a request, the caller is code in this process (``Client.login`` of the tests, a
    shell), not a client on the network: there is no address to count and nothing to limit.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> AbstractBaseUser | None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def client_address(request: HttpRequest) -> str | None:
    """The address failures are counted by (AXES_CLIENT_IP_CALLABLE): the connection's peer,
    REMOTE_ADDR. X-Forwarded-For is not read here, whatever a client sends: axes would
    otherwise read it through django-ipware whenever that package happens to be installed.
    Behind a reverse proxy it is uvicorn that puts the forwarded address into the peer, and only
    for a proxy it trusts (``--forwarded-allow-ips``, FORWARDED_ALLOW_IPS, 127.0.0.1 by
    default); otherwise every login through the proxy counts as the proxy's address."""
    return request.META.get("REMOTE_ADDR")


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """What axes answers a login refused for too many failures (AXES_LOCKOUT_CALLABLE)."""
    cool_off_s = int(settings.AXES_COOLOFF_TIME.total_seconds())
    scope = LOCKED_SCOPE[settings.PDSERVE_LOGIN_LOCKOUT]
    message = (f"Too many failed logins {scope}: locked out for {cool_off_s // 60} minutes "
               f"after the last failure.")
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message}, status=LOCKED_OUT_STATUS)
    else:
        response = render(request, "credentials/locked_out.html", {"message": message},
                          status=LOCKED_OUT_STATUS)
    response["Retry-After"] = str(cool_off_s)
    return response
