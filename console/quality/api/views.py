from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import is_superuser, roles_of, visible
from console.api_router import ID_PARAMETER
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.fleet.services import local_node
from console.quality import services
from console.quality.api.serializers import (
    DeploymentGateSerializer,
    GateResultSerializer,
    MeasurementSerializer,
    gate_summary,
)
from console.quality.measure import MeasureRefused, queue_measurement
from console.quality.measure_permission import may_measure
from console.quality.models import GateResult, VariantMeasurement
from console.query_params import MAX_ID, bounded_int


class DeploymentGateView(APIView):
    """GET: the plan's gate settings and its recent results (the team's). POST: run the gate
    now (202; the team's operators)."""

    permission_classes = [TeamRole]
    team_roles = {"post": Role.OPERATOR}

    def _deployment(self, request: Request, pk: int) -> Deployment:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        return deployment

    @extend_schema(parameters=[ID_PARAMETER], responses=DeploymentGateSerializer)
    def get(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        results = deployment.gate_results.all()[:20]
        return Response({**gate_summary(deployment),
                         "results": GateResultSerializer(results, many=True).data})

    @extend_schema(parameters=[ID_PARAMETER], request=None, responses={
        202: GateResultSerializer,
        409: OpenApiResponse(description="the gate cannot run now; `detail` says why")})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        try:
            gate = services.request_gate(deployment)
        except services.GateRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(GateResultSerializer(gate).data, status=status.HTTP_202_ACCEPTED)


class GateResultViewSet(viewsets.ReadOnlyModelViewSet):
    """Gate results: a deployment's are its team's to read."""

    serializer_class = GateResultSerializer
    permission_classes = [TeamRole]

    def team_id_of(self, result: GateResult) -> int:
        return result.deployment.team_id

    def get_queryset(self) -> QuerySet[GateResult]:
        results = visible(GateResult.objects.select_related("deployment"), self.request.user,
                          team_field="deployment__team")
        deployment = self.request.query_params.get("deployment")
        return results.filter(deployment__name=deployment) if deployment else results


class MeasureSerializer(serializers.Serializer):
    """Queueing a measurement: the variant by id, the node by name (default: the local one)."""

    variant = serializers.PrimaryKeyRelatedField(queryset=Variant.objects.select_related("base"))
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all(),
                                        required=False)
    dtype = serializers.ChoiceField(choices=Deployment.Dtype.choices, default="bfloat16")


class MeasurementAccess(BasePermission):
    """Measurements are of shared variants: anyone signed in reads them. Starting one needs
    the operator role in some team (or a superuser); ``create`` checks the variant's
    (console/quality/measure_permission.py)."""

    message = "measuring a variant needs the operator role in a team with a deployment of its model"

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active):
            return False
        if request.method in SAFE_METHODS or is_superuser(user):
            return True
        return any(role.rank >= Role.OPERATOR.rank for role in roles_of(user).values())


@extend_schema_view(list=extend_schema(parameters=[OpenApiParameter(
    "variant", {"type": "integer", "minimum": 1, "maximum": MAX_ID},
    description="only this variant's measurements")]))
class MeasurementViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Variants measured on nodes. POST {"variant": id, "node": name, "dtype": ...} queues one
    (an operator of a team with a deployment of the variant's model, or a superuser)."""

    permission_classes = [MeasurementAccess]

    def get_queryset(self) -> QuerySet[VariantMeasurement]:
        rows = VariantMeasurement.objects.select_related("variant__base", "node")
        variant = self.request.query_params.get("variant")
        if variant is None or self.action != "list":
            return rows
        return rows.filter(variant_id=bounded_int(variant, "variant", 1, MAX_ID))

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return MeasureSerializer if self.action == "create" else MeasurementSerializer

    @extend_schema(responses={202: MeasurementSerializer})
    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        form = self.get_serializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        if not may_measure(request.user, data["variant"]):
            raise PermissionDenied(MeasurementAccess.message)
        try:
            measurement = queue_measurement(data["variant"], data.get("node") or local_node(),
                                            data["dtype"])
        except MeasureRefused as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return Response(MeasurementSerializer(measurement).data, status=status.HTTP_202_ACCEPTED)
