from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.models import Role, Team
from console.accounts.permissions import TeamRole
from console.accounts.roles import team_to_create_in, visible
from console.gateway.aliases import create_alias, delete_alias, update_alias
from console.gateway.api.serializers import (
    ApiKeySerializer,
    CreatedApiKeySerializer,
    ModelAliasSerializer,
)
from console.gateway.models import LIMIT_FIELDS, ApiKey, ModelAlias
from console.gateway.services import create_key, revoke_key, scope_errors, update_key


def operated_team(request: Request, data: dict[str, Any]) -> Team:
    """The team a new key or alias goes to: the body's, or the caller's one operated team."""
    try:
        return team_to_create_in(request.user, data.get("team"), Role.OPERATOR)
    except DjangoValidationError as exc:
        raise ValidationError(exc.message_dict) from exc


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Inference API keys. Keys are revoked, never deleted, so that a revoked key stays
    refused (and named as revoked) by every router."""

    serializer_class = ApiKeySerializer
    permission_classes = [TeamRole]
    team_roles = {"create": Role.OPERATOR, "update": Role.OPERATOR,
                  "partial_update": Role.OPERATOR, "revoke": Role.OPERATOR}

    def get_queryset(self) -> QuerySet[ApiKey]:
        return visible(ApiKey.objects.select_related("created_by", "team").prefetch_related(
            "deployments"), self.request.user)

    @extend_schema(responses={201: CreatedApiKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        team = operated_team(request, data)
        errors = scope_errors(team, data.get("deployments", []))
        if errors:
            raise ValidationError(errors)
        key, secret = create_key(
            name=data["name"], team=team, deployments=data.get("deployments", []),
            all_deployments=data.get("all_deployments", False),
            limits={field: data.get(field) for field in LIMIT_FIELDS}, user=request.user)
        answer = CreatedApiKeySerializer(key, context={**self.get_serializer_context(),
                                                       "secret": secret})
        return Response(answer.data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: ApiKeySerializer) -> None:  # type: ignore[override]
        errors = scope_errors(serializer.instance.team,
                              serializer.validated_data.get("deployments", []))
        if errors:
            raise ValidationError(errors)
        serializer.instance = update_key(serializer.instance, dict(serializer.validated_data))

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the key: every router refuses it from its next request on."""
        key = revoke_key(self.get_object())
        return Response(self.get_serializer(key).data)


class ModelAliasViewSet(viewsets.ModelViewSet):
    """Model aliases at the gateway: another name for one deployment, or an ordered list of
    deployments tried in turn (fallbacks)."""

    serializer_class = ModelAliasSerializer
    permission_classes = [TeamRole]
    team_roles = {"create": Role.OPERATOR, "update": Role.OPERATOR,
                  "partial_update": Role.OPERATOR, "destroy": Role.OPERATOR}

    def get_queryset(self) -> QuerySet[ModelAlias]:
        return visible(ModelAlias.objects.select_related("team", "created_by").prefetch_related(
            "targets__deployment"), self.request.user)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        team = operated_team(request, data)
        try:
            alias = create_alias(name=data["name"], team=team, targets=data["targets"],
                                 user=request.user)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        return Response(self.get_serializer(alias).data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: ModelAliasSerializer) -> None:  # type: ignore[override]
        data = serializer.validated_data
        try:
            serializer.instance = update_alias(serializer.instance, name=data.get("name"),
                                               targets=data.get("targets"))
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc

    def perform_destroy(self, instance: ModelAlias) -> None:
        delete_alias(instance)
