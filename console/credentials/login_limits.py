"""Login rate limiting by django-axes: the authentication backend that refuses a locked-out
user or address, and the answer a locked-out login gets (JSON on the API, a page otherwise)."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

LOCKED_OUT_STATUS = 429


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


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """What axes answers a login refused for too many failures (AXES_LOCKOUT_CALLABLE)."""
    cool_off_s = int(settings.AXES_COOLOFF_TIME.total_seconds())
    message = (f"Too many failed logins for this user or from this address: locked out for "
               f"{cool_off_s // 60} minutes after the last failure.")
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": message}, status=LOCKED_OUT_STATUS)
    else:
        response = render(request, "credentials/locked_out.html", {"message": message},
                          status=LOCKED_OUT_STATUS)
    response["Retry-After"] = str(cool_off_s)
    return response
