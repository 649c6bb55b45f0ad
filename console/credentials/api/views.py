from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.credentials.api.serializers import (
    ApiTokenSerializer,
    CreatedApiTokenSerializer,
    LoginSerializer,
    NewApiTokenSerializer,
    TokenFilterSerializer,
)
from console.credentials.models import ApiToken
from console.credentials.services import create_token, revoke_token


def _created(token: ApiToken, secret: str) -> Response:
    answer = Response(CreatedApiTokenSerializer(token, context={"secret": secret}).data,
                      status=status.HTTP_201_CREATED)
    answer["Cache-Control"] = "no-store"
    return answer


class LoginView(APIView):
    """POST a username and password for a new API token (for scripts)."""

    # A stale or wrong token in a script's headers must not stop it from logging in afresh.
    authentication_classes: list[type] = []
    permission_classes = [permissions.AllowAny]

    @extend_schema(request=LoginSerializer, responses={
        201: CreatedApiTokenSerializer,
        400: OpenApiResponse(description="a field is missing or wrong, or the username and "
                                         "password do not match an active user"),
        429: OpenApiResponse(description="locked out after too many failed logins for this "
                                         "username from this address (PDSERVE_LOGIN_LOCKOUT); "
                                         "see Retry-After")})
    def post(self, request: Request) -> Response:
        login = LoginSerializer(data=request.data)
        login.is_valid(raise_exception=True)
        data = login.validated_data
        # The Django request: axes counts the failure by its address, and when this login is
        # locked out its middleware answers 429 in place of the 400 below (login_limits.py).
        user = authenticate(request._request, username=data["username"], password=data["password"])
        if user is None:
            raise serializers.ValidationError(
                {"non_field_errors": ["Unable to log in with the given username and password."]})
        # The audit log names whoever just proved their password as the token's maker.
        request.user = user
        token, secret = create_token(user, data["name"], data["expires_in_days"])
        return _created(token, secret)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """API tokens: a user's own; a superuser's list shows everyone's (``?user=<id>`` for one).
    Tokens are revoked, never deleted, so that a revoked token stays named as revoked."""

    serializer_class = ApiTokenSerializer

    def get_queryset(self) -> QuerySet[ApiToken]:
        tokens = ApiToken.objects.select_related("user")
        if not self.request.user.is_superuser:
            tokens = tokens.filter(user_id=self.request.user.pk)
        if self.action == "list":
            query = TokenFilterSerializer(data=self.request.query_params)
            query.is_valid(raise_exception=True)
            if "user" in query.validated_data:
                tokens = tokens.filter(user_id=query.validated_data["user"])
        return tokens

    @extend_schema(parameters=[TokenFilterSerializer])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=NewApiTokenSerializer, responses={201: CreatedApiTokenSerializer})
    def create(self, request: Request) -> Response:
        """A new token of the calling user; the answer is the only place its secret appears."""
        new = NewApiTokenSerializer(data=request.data)
        new.is_valid(raise_exception=True)
        token, secret = create_token(request.user, new.validated_data["name"],
                                     new.validated_data["expires_in_days"])
        return _created(token, secret)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the token: refused with 401 from its next call on."""
        return Response(self.get_serializer(revoke_token(self.get_object())).data)
