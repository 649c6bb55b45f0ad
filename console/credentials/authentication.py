"""The REST API's token authentication: ``Authorization: Token <secret>`` (the form scripts
already send) or ``Bearer <secret>``, answered 401 with the reason when the token is unknown,
expired, revoked or its user disabled."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from console.audit.actors import TOKEN_ATTRIBUTE
from console.credentials.models import ApiToken
from console.credentials.services import TokenRefused, accepted_token, note_use

KEYWORDS = (b"token", b"bearer")


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        words = authentication.get_authorization_header(request).split()
        if not words or words[0].lower() not in KEYWORDS:
            return None
        if len(words) != 2:
            raise exceptions.AuthenticationFailed(
                "Invalid Authorization header: expected 'Token <secret>' or 'Bearer <secret>'.")
        try:
            secret = words[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("Invalid token: not ASCII.") from exc
        now = timezone.now()
        try:
            token = accepted_token(secret, now)
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from refused
        note_use(token, now)
        # The audit log names the token a change was made with (console/audit/actors.py).
        setattr(request._request, TOKEN_ATTRIBUTE, token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # A challenge makes DRF answer 401 rather than 403 to a call without credentials.
        return 'Token realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The scheme in the OpenAPI schema (drf-spectacular registers it by subclassing)."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <secret>` or `Bearer <secret>`; a secret comes from "
                               "POST /api/v1/auth/token or the API tokens page."}
