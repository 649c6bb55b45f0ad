from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

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
from console.quality.models import GateResult, VariantMeasurement
from console.query_params import MAX_ID, bounded_int


class DeploymentGateView(APIView):
    """GET: the plan's gate settings and its recent results. POST: run the gate now (202)."""

    @extend_schema(parameters=[ID_PARAMETER], responses=DeploymentGateSerializer)
    def get(self, request: Request, pk: int) -> Response:
        deployment = get_object_or_404(Deployment, pk=pk)
        results = deployment.gate_results.all()[:20]
        return Response({**gate_summary(deployment),
                         "results": GateResultSerializer(results, many=True).data})

    @extend_schema(parameters=[ID_PARAMETER], request=None, responses={
        202: GateResultSerializer,
        409: OpenApiResponse(description="the gate cannot run now; `detail` says why")})
    def post(self, request: Request, pk: int) -> Response:
        deployment = get_object_or_404(Deployment, pk=pk)
        try:
            gate = services.request_gate(deployment)
        except services.GateRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(GateResultSerializer(gate).data, status=status.HTTP_202_ACCEPTED)


class GateResultViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GateResultSerializer

    def get_queryset(self) -> QuerySet[GateResult]:
        results = GateResult.objects.select_related("deployment")
        deployment = self.request.query_params.get("deployment")
        return results.filter(deployment__name=deployment) if deployment else results


class MeasureSerializer(serializers.Serializer):
    """Queueing a measurement: the variant by id, the node by name (default: the local one)."""

    variant = serializers.PrimaryKeyRelatedField(queryset=Variant.objects.select_related("base"))
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all(),
                                        required=False)
    dtype = serializers.ChoiceField(choices=Deployment.Dtype.choices, default="bfloat16")


@extend_schema_view(list=extend_schema(parameters=[OpenApiParameter(
    "variant", {"type": "integer", "minimum": 1, "maximum": MAX_ID},
    description="only this variant's measurements")]))
class MeasurementViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Variants measured on nodes. POST {"variant": id, "node": name, "dtype": ...} queues one."""

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
        try:
            measurement = queue_measurement(data["variant"], data.get("node") or local_node(),
                                            data["dtype"])
        except MeasureRefused as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return Response(MeasurementSerializer(measurement).data, status=status.HTTP_202_ACCEPTED)
