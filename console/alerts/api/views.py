from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import is_superuser, require, roles_of, team_to_create_in, visible
from console.alerts import services
from console.alerts.api.serializers import (
    AcknowledgeSerializer,
    AlertEventSerializer,
    AlertRuleSerializer,
    AlertSerializer,
    DeliverySerializer,
    NotifierSerializer,
    SilenceSerializer,
)
from console.alerts.models import (
    Alert,
    AlertEvent,
    AlertRule,
    AlertState,
    Delivery,
    Notifier,
    Severity,
    Silence,
)
from console.alerts.prometheus_rules import render_rule_file
from console.alerts.rule_preview import preview
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.query_params import MAX_ID, bounded_int


def _time(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        parsed = parse_datetime(raw)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValidationError({name: [f"an ISO 8601 time, got {raw!r}"]})
    return parsed if parsed.tzinfo else timezone.make_aware(parsed, UTC)


def _choice(request: Request, name: str, choices: list[str]) -> str | None:
    raw = request.query_params.get(name)
    if raw and raw not in choices:
        raise ValidationError({name: [f"one of {', '.join(choices)}, got {raw!r}"]})
    return raw or None


FILTERS = [
    OpenApiParameter("deployment", str, description="a deployment's name"),
    OpenApiParameter("severity", str, enum=["critical", "warning", "info"]),
    OpenApiParameter("state", str, enum=list(AlertState.values)),
    OpenApiParameter("rule", int, description="a rule's id"),
    OpenApiParameter("since", OpenApiTypes.DATETIME),
    OpenApiParameter("until", OpenApiTypes.DATETIME),
]


class AlertRuleViewSet(viewsets.ModelViewSet):
    """Alert rules of the deployments of your teams. Reading needs the viewer role, changing a
    rule the admin role in the deployment's team."""

    serializer_class = AlertRuleSerializer
    permission_classes = [TeamRole]
    team_roles = {"preview": Role.ADMIN}

    def get_queryset(self) -> QuerySet[AlertRule]:
        rules = visible(AlertRule.objects.select_related("deployment").prefetch_related("alerts"),
                        self.request.user, "deployment__team")
        name = self.request.query_params.get("deployment")
        return rules.filter(deployment__name=name) if name else rules

    @staticmethod
    def team_id_of(rule: AlertRule) -> int:
        return rule.deployment.team_id

    @extend_schema(parameters=[OpenApiParameter("deployment", str)])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def perform_create(self, serializer: AlertRuleSerializer) -> None:  # type: ignore[override]
        require(self.request.user, serializer.validated_data["deployment"].team_id, Role.ADMIN)
        serializer.instance = services.create_rule(dict(serializer.validated_data))

    def perform_update(self, serializer: AlertRuleSerializer) -> None:  # type: ignore[override]
        serializer.instance = services.update_rule(serializer.instance,
                                                   dict(serializer.validated_data))

    def perform_destroy(self, instance: AlertRule) -> None:
        services.delete_rule(instance)

    @extend_schema(request=AlertRuleSerializer, responses={200: OpenApiTypes.OBJECT})
    @action(detail=False, methods=["post"])
    def preview(self, request: Request) -> Response:
        """Evaluate a rule (the body, not saved) over the last hour: when it would have fired."""
        # Previewing is part of editing a rule: the admin role, asked before the body is read.
        if not is_superuser(request.user) and not any(
                role.rank >= Role.ADMIN.rank for role in roles_of(request.user).values()):
            raise PermissionDenied("previewing a rule needs the admin role in a team")
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        require(request.user, serializer.validated_data["deployment"].team_id, Role.ADMIN)
        rule = AlertRule(**serializer.validated_data)
        return Response(preview(rule, timezone.now()))


class AlertViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Alerts (one per rule and label set) with their current state; acknowledging one needs the
    operator role."""

    serializer_class = AlertSerializer
    permission_classes = [TeamRole]
    team_roles = {"acknowledge": Role.OPERATOR}

    @staticmethod
    def team_id_of(alert: Alert) -> int:
        return alert.deployment.team_id

    def get_queryset(self) -> QuerySet[Alert]:
        alerts = visible(Alert.objects.select_related("deployment", "rule", "acknowledged_by"),
                         self.request.user, "deployment__team")
        if self.action != "list":
            return alerts
        return _filtered(self.request, alerts, rule="rule", state="state",
                         since="evaluated_at__gte", until="active_since__lte")

    @extend_schema(parameters=FILTERS)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=AcknowledgeSerializer, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        body = AcknowledgeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        alert = services.acknowledge(self.get_object(), request.user, body.validated_data["comment"])
        return Response(self.get_serializer(alert).data)


def _filtered(request: Request, rows: QuerySet[Any], *, rule: str, state: str, since: str,
              until: str) -> QuerySet[Any]:
    """The list filters that alerts and their history share, each a 400 naming a bad value;
    the keyword arguments name the lookups of the model filtered."""
    params = request.query_params
    if params.get("deployment"):
        rows = rows.filter(deployment__name=params["deployment"])
    if severity := _choice(request, "severity", list(Severity.values)):
        rows = rows.filter(**{f"{rule}__severity": severity})
    if wanted := _choice(request, "state", list(AlertState.values)):
        rows = rows.filter(**{state: wanted})
    if params.get("rule"):
        rows = rows.filter(**{f"{rule}_id": bounded_int(params["rule"], "rule", 1, MAX_ID)})
    if after := _time(request, "since"):
        rows = rows.filter(**{since: after})
    if before := _time(request, "until"):
        rows = rows.filter(**{until: before})
    return rows


class AlertEventViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The alert history: every state change with the value that caused it, newest first."""

    serializer_class = AlertEventSerializer
    permission_classes = [TeamRole]

    def get_queryset(self) -> QuerySet[AlertEvent]:
        events = visible(AlertEvent.objects.select_related(
            "alert__deployment", "alert__rule", "alert__acknowledged_by"),
            self.request.user, "deployment__team")
        return _filtered(self.request, events, rule="alert__rule", state="to_state",
                         since="at__gte", until="at__lte")

    @extend_schema(parameters=FILTERS)
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)


class SilenceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     viewsets.GenericViewSet):
    """Silences, as in Alertmanager: label matchers between two instants. They are expired,
    never deleted, so that the history can say what muted an alert. The operator role."""

    serializer_class = SilenceSerializer
    permission_classes = [TeamRole]
    team_roles = {"create": Role.OPERATOR, "expire": Role.OPERATOR}

    def get_queryset(self) -> QuerySet[Silence]:
        return visible(Silence.objects.select_related("team", "created_by"), self.request.user)

    def perform_create(self, serializer: SilenceSerializer) -> None:  # type: ignore[override]
        data = dict(serializer.validated_data)
        try:
            data["team"] = team_to_create_in(self.request.user, data.get("team"), Role.OPERATOR)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        serializer.instance = services.create_silence(data, self.request.user)

    @extend_schema(request=None, responses=SilenceSerializer)
    @action(detail=True, methods=["post"])
    def expire(self, request: Request, pk: str | None = None) -> Response:
        silence = services.expire_silence(self.get_object())
        return Response(self.get_serializer(silence).data)


class NotifierViewSet(viewsets.ModelViewSet):
    """Where notifications go: webhooks (Alertmanager's payload) and email. The admin role."""

    serializer_class = NotifierSerializer
    permission_classes = [TeamRole]

    def get_queryset(self) -> QuerySet[Notifier]:
        return visible(Notifier.objects.select_related("team"), self.request.user)

    def perform_create(self, serializer: NotifierSerializer) -> None:  # type: ignore[override]
        data = dict(serializer.validated_data)
        try:
            data["team"] = team_to_create_in(self.request.user, data.get("team"), Role.ADMIN)
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc
        serializer.instance = services.create_notifier(data)

    def perform_update(self, serializer: NotifierSerializer) -> None:  # type: ignore[override]
        serializer.instance = services.update_notifier(serializer.instance,
                                                       dict(serializer.validated_data))

    def perform_destroy(self, instance: Notifier) -> None:
        services.delete_notifier(instance)


class DeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every notification and each attempt to deliver it."""

    serializer_class = DeliverySerializer
    permission_classes = [TeamRole]

    @staticmethod
    def team_id_of(delivery: Delivery) -> int:
        return delivery.notifier.team_id

    def get_queryset(self) -> QuerySet[Delivery]:
        return visible(Delivery.objects.select_related("notifier", "deployment").prefetch_related(
            "attempt_log"), self.request.user, "notifier__team")


# A YAML document: clients (and schemathesis) read it as the object it holds.
YAML = {(200, "application/yaml"): OpenApiResponse(
    OpenApiTypes.OBJECT, description="a Prometheus rule file: {groups: [{name, interval, rules}]}")}


def _yaml(text: str, filename: str) -> HttpResponse:
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{filename}"'
    return response


class DeploymentRuleFileView(APIView):
    """The deployment's rules as a Prometheus rule file over the console's /metrics."""

    permission_classes = [TeamRole]

    @extend_schema(parameters=[ID_PARAMETER], responses=YAML)
    def get(self, request: Request, pk: int) -> HttpResponse:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        rules = AlertRule.objects.filter(deployment=deployment).select_related("deployment")
        return _yaml(render_rule_file(rules), f"{deployment.name}-alert-rules.yaml")


class RuleFileView(APIView):
    """The rules of every deployment you can see, as one Prometheus rule file."""

    permission_classes = [TeamRole]

    @extend_schema(responses=YAML)
    def get(self, request: Request) -> HttpResponse:
        rules = visible(AlertRule.objects.select_related("deployment"), request.user,
                        "deployment__team")
        return _yaml(render_rule_file(rules), "pdserve-alert-rules.yaml")
