from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
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
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all(),
                                        required=False)
    dtype = serializers.ChoiceField(choices=Deployment.Dtype.choices, default="bfloat16")


class MeasurementViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Variants measured on nodes. POST {"variant": id, "node": name, "dtype": ...} queues one."""

    def get_queryset(self) -> QuerySet[VariantMeasurement]:
        rows = VariantMeasurement.objects.select_related("variant__base", "node")
        variant = self.request.query_params.get("variant")
        return rows.filter(variant_id=variant) if variant and variant.isdigit() else rows

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return MeasurementSerializer

    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        variant_id = request.data.get("variant")
        variant = (Variant.objects.filter(pk=variant_id).first()
                   if isinstance(variant_id, int) and not isinstance(variant_id, bool) else None)
        if variant is None:
            raise serializers.ValidationError({"variant": [f"no variant with id {variant_id!r}"]})
        form = MeasureSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            measurement = queue_measurement(variant, form.validated_data.get("node") or local_node(),
                                            form.validated_data["dtype"])
        except MeasureRefused as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return Response(MeasurementSerializer(measurement).data, status=status.HTTP_202_ACCEPTED)
