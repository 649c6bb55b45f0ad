from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from typing import Any

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role, Team
from console.accounts.permissions import TeamRole
from console.accounts.roles import team_to_create_in, visible, visible_teams
from console.deployments.models import Deployment
from console.gateway.aliases import create_alias, delete_alias, update_alias
from console.gateway.api.serializers import (
    ApiKeySerializer,
    CreatedApiKeySerializer,
    GatewayTrafficSerializer,
    ModelAliasSerializer,
    TeamBudgetSerializer,
    UsageRowSerializer,
)
from console.gateway.budgets import spend
from console.gateway.forms import FILTERS as USAGE_FILTERS
from console.gateway.forms import UsageFilterForm
from console.gateway.models import ApiKey, ModelAlias, TeamBudget, UsageDay
from console.gateway.services import (
    KEY_SETTINGS,
    clean_model_limits,
    clear_team_budget,
    create_key,
    revoke_key,
    scope_errors,
    set_team_budget,
    update_key,
)
from console.gateway.traffic import traffic
from console.gateway.usage import aggregate


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

    def get_serializer_context(self) -> dict[str, Any]:
        # The budgets' spend in one query for every key the caller sees, not one per key.
        budgeted = visible(ApiKey.objects.filter(budget_tokens__isnull=False), self.request.user)
        return {**super().get_serializer_context(), "spend": spend(list(budgeted))}

    @extend_schema(responses={201: CreatedApiKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        team = operated_team(request, data)
        errors = scope_errors(team, data.get("deployments", []))
        if errors:
            raise ValidationError(errors)
        if "model_limits" in data:
            data["model_limits"] = _model_limits(data["model_limits"], team)
        key, secret = create_key(
            name=data["name"], team=team, deployments=data.get("deployments", []),
            all_deployments=data.get("all_deployments", False),
            limits={field: data.get(field) for field in KEY_SETTINGS}, user=request.user)
        answer = CreatedApiKeySerializer(key, context={**self.get_serializer_context(),
                                                       "secret": secret})
        return Response(answer.data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: ApiKeySerializer) -> None:  # type: ignore[override]
        errors = scope_errors(serializer.instance.team,
                              serializer.validated_data.get("deployments", []))
        if errors:
            raise ValidationError(errors)
        changes = dict(serializer.validated_data)
        if "model_limits" in changes:
            changes["model_limits"] = _model_limits(changes["model_limits"],
                                                    serializer.instance.team)
        serializer.instance = update_key(serializer.instance, changes)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the key: every router refuses it from its next request on."""
        key = revoke_key(self.get_object())
        return Response(self.get_serializer(key).data)


def _model_limits(value: Any, team: Team) -> dict[str, dict[str, int | None]]:
    """The per-model limits checked against ``team``'s models; a 400 naming the field."""
    try:
        return clean_model_limits(value if value is not None else {}, team)
    except DjangoValidationError as exc:
        raise ValidationError({"model_limits": exc.messages}) from exc


class TeamBudgetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    """Teams' token budgets, by team name: every team the caller sees, with or without a
    budget. A team's admin sets one (PUT/PATCH) or removes it (DELETE)."""

    serializer_class = TeamBudgetSerializer
    permission_classes = [TeamRole]
    lookup_field = "name"
    team_roles = {"update": Role.ADMIN, "partial_update": Role.ADMIN, "destroy": Role.ADMIN}

    @staticmethod
    def team_id_of(team: Team) -> int:
        return team.pk

    def get_queryset(self) -> QuerySet[Team]:
        return visible_teams(self.request.user).select_related("token_budget").order_by("name")

    def get_serializer_context(self) -> dict[str, Any]:
        budgets = TeamBudget.objects.filter(team__in=visible_teams(self.request.user))
        return {**super().get_serializer_context(), "spend": spend(teams=list(budgets))}

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        team = self.get_object()
        partial = kwargs.get("partial", False)
        current = TeamBudget.objects.filter(team=team).first()
        serializer = self.get_serializer(data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if "budget_tokens" not in data and current is None:
            raise ValidationError({"budget_tokens": ["the team has no budget yet: give its "
                                                     "tokens"]})
        set_team_budget(team, data.get("budget_tokens", current.tokens if current else 0),
                        data.get("budget_period", current.period if current else "month"))
        team = self.get_queryset().get(pk=team.pk)
        return Response(self.get_serializer(team).data)

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        budget = TeamBudget.objects.filter(team=self.get_object()).first()
        if budget is None:
            return Response({"detail": "the team has no token budget"},
                            status=status.HTTP_404_NOT_FOUND)
        clear_team_budget(budget)
        return Response(status=status.HTTP_204_NO_CONTENT)


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


def usage_filters(request: Request) -> UsageFilterForm:
    """The request's usage filters, cleaned; a 400 naming each bad one."""
    form = UsageFilterForm(request.query_params)
    if not form.is_valid():
        raise ValidationError({name: list(messages) for name, messages in form.errors.items()})
    return form


def _parameter_schema(field: forms.Field) -> dict[str, Any]:
    if isinstance(field, forms.IntegerField):
        return {"type": "integer", "minimum": field.min_value, "maximum": field.max_value}
    if isinstance(field, forms.DateField):
        return {"type": "string", "format": "date"}
    return {"type": "string", "maxLength": field.max_length}


def _parameters(names: Iterable[str]) -> list[OpenApiParameter]:
    fields = UsageFilterForm.base_fields
    return [OpenApiParameter(name, _parameter_schema(fields[name]),
                             description=str(fields[name].help_text)) for name in names]


@extend_schema_view(list=extend_schema(
    parameters=_parameters([*USAGE_FILTERS, "group_by"]),
    description="Stored usage (the routers' ledgers, read every 5 s) summed per group: by day "
                "unless group_by names other dimensions. Only your teams' usage is counted; "
                "a filter on another team's id matches nothing."))
class UsageViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Usage per day, key, team, model or deployment: read only."""

    serializer_class = UsageRowSerializer
    permission_classes = [TeamRole]

    def get_queryset(self) -> QuerySet[UsageDay]:
        form = usage_filters(self.request)
        rows = form.filter(visible(UsageDay.objects.all(), self.request.user))
        return aggregate(rows, form.cleaned_data["group_by"])


EXPORT_COLUMNS = ("day", "team", "key_prefix", "key_name", "deployment", "model", "requests",
                  "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum")
# A spreadsheet runs a cell that starts with one of these as a formula: a key's name is the
# client's text, so such a cell is quoted as text (as the audit export does).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return "" if value is None else value


def _export_lines(rows: QuerySet[UsageDay]) -> Iterator[str]:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(EXPORT_COLUMNS)
    for row in rows.iterator(chunk_size=2000):
        writer.writerow([_cell(value) for value in (
            row.day.isoformat(), row.team.name if row.team else "", row.key_prefix,
            row.key.name if row.key else "", row.deployment_name, row.model, row.requests,
            row.errors, row.prompt_tokens, row.completion_tokens, row.latency_ms_sum)])
        yield out.getvalue()
        out.seek(0)
        out.truncate()
    yield out.getvalue()


class UsageExportView(APIView):
    """The stored usage rows, one per day, deployment and key, as CSV."""

    permission_classes = [TeamRole]

    @extend_schema(
        parameters=_parameters(USAGE_FILTERS),
        responses={(200, "text/csv"): OpenApiResponse(
            OpenApiTypes.STR, description=f"a header row ({', '.join(EXPORT_COLUMNS)}), then "
                                          "one row per stored day, deployment and key")})
    def get(self, request: Request) -> StreamingHttpResponse:
        form = usage_filters(request)
        rows = form.filter(visible(UsageDay.objects.select_related("team", "key"), request.user))
        response = StreamingHttpResponse(
            _export_lines(rows.order_by("day", "deployment_name", "key_prefix", "router_key")),
            content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = 'attachment; filename="pdserve-usage.csv"'
        return response


class GatewayTrafficView(APIView):
    """Each deployment's traffic through the gateway and its queue: the gateway page's table."""

    permission_classes = [TeamRole]

    @extend_schema(responses=GatewayTrafficSerializer,
                   description="Per deployment you may see: requests and refusals per second "
                               "through the gateway, requests in flight against the limit past "
                               "which it queues, and who waits, by priority band and fairness "
                               "flow (read live from the gateway).")
    def get(self, request: Request) -> Response:
        deployments = list(visible(Deployment.objects.order_by("name"), request.user))
        return Response(GatewayTrafficSerializer(traffic(deployments)).data)
