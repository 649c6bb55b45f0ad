"""Autoscaling: read by the team's viewers, its policies set by its operators."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.advisor import services as advice_services
from console.advisor.api.serializers import LoadQuerySerializer
from console.advisor.forms import LoadForm
from console.advisor.load_sources import LoadUnavailable
from console.api_router import ID_PARAMETER
from console.autoscaling import advised_band, services
from console.autoscaling.api.serializers import (
    AdvisedBandSerializer,
    AutoscalingSerializer,
    DecisionSerializer,
    PolicySerializer,
    RatioBandSerializer,
)
from console.autoscaling.decide import REASONS
from console.autoscaling.models import PoolPolicy, RatioBand, ScalingDecision
from console.autoscaling.pool_states import pool_states
from console.deployments.models import Deployment

ROLE_PARAMETER = OpenApiParameter("role", str, OpenApiParameter.PATH,
                                  enum=[r.value for r in PoolPolicy.Role])


class _OnDeployment(APIView):
    permission_classes = [TeamRole]
    team_roles = {"put": Role.OPERATOR, "patch": Role.OPERATOR, "delete": Role.OPERATOR}

    def deployment(self, request: Request, pk: int) -> Deployment:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        return deployment


class AutoscalingView(_OnDeployment):
    """Each pool of the deployment: its count now, ready, the latest decision and its policy;
    and the P:D ratio band."""

    serializer_class = AutoscalingSerializer

    @extend_schema(parameters=[ID_PARAMETER], responses=AutoscalingSerializer)
    def get(self, request: Request, pk: int) -> Response:
        deployment = self.deployment(request, pk)
        return Response(autoscaling_data(deployment))


def autoscaling_data(deployment: Deployment) -> dict[str, Any]:
    band = RatioBand.objects.filter(deployment=deployment).first()
    return AutoscalingSerializer({"pools": pool_states(deployment), "ratio_band": band}).data


class PolicyView(_OnDeployment):
    """One pool's policy: PUT sets it whole (thresholds left out take the signal's defaults),
    PATCH changes some fields (the mode switch: ``{"mode": "off"}``), DELETE removes it."""

    serializer_class = PolicySerializer

    def _policy(self, deployment: Deployment, role: str) -> PoolPolicy:
        services.check_role(deployment, role)
        return get_object_or_404(PoolPolicy, deployment=deployment, role=role)

    # The path alone would give it the operationId of the deployment's autoscaling GET.
    @extend_schema(parameters=[ID_PARAMETER, ROLE_PARAMETER], responses=PolicySerializer,
                   operation_id="v1_deployments_autoscaling_policy_retrieve")
    def get(self, request: Request, pk: int, role: str) -> Response:
        return Response(PolicySerializer(self._policy(self.deployment(request, pk), role)).data)

    def _write(self, request: Request, pk: int, role: str, partial: bool) -> Response:
        deployment = self.deployment(request, pk)
        body = PolicySerializer(data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        values = dict(body.validated_data)
        if not partial and "signal" not in values:
            raise ValidationError({"signal": ["This field is required."]})
        # A Django ValidationError (keyed by field) is a 400 through console.api_errors.
        policy, created = services.save_policy(deployment, role, values, partial=partial)
        return Response(PolicySerializer(policy).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[ID_PARAMETER, ROLE_PARAMETER], request=PolicySerializer,
                   responses={200: PolicySerializer, 201: PolicySerializer})
    def put(self, request: Request, pk: int, role: str) -> Response:
        return self._write(request, pk, role, partial=False)

    @extend_schema(parameters=[ID_PARAMETER, ROLE_PARAMETER], request=PolicySerializer,
                   responses=PolicySerializer)
    def patch(self, request: Request, pk: int, role: str) -> Response:
        return self._write(request, pk, role, partial=True)

    @extend_schema(parameters=[ID_PARAMETER, ROLE_PARAMETER], responses={204: None})
    def delete(self, request: Request, pk: int, role: str) -> Response:
        services.delete_policy(self._policy(self.deployment(request, pk), role))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RatioBandView(_OnDeployment):
    """The P:D ratio band: prefill instances per decode instance, kept within it."""

    serializer_class = RatioBandSerializer

    @extend_schema(parameters=[ID_PARAMETER], responses=RatioBandSerializer)
    def get(self, request: Request, pk: int) -> Response:
        deployment = self.deployment(request, pk)
        return Response(RatioBandSerializer(get_object_or_404(RatioBand,
                                                              deployment=deployment)).data)

    @extend_schema(parameters=[ID_PARAMETER], request=RatioBandSerializer,
                   responses=RatioBandSerializer)
    def put(self, request: Request, pk: int) -> Response:
        deployment = self.deployment(request, pk)
        body = RatioBandSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        band = services.save_band(deployment, body.validated_data["min_ratio"],
                                  body.validated_data["max_ratio"])
        return Response(RatioBandSerializer(band).data)

    @extend_schema(parameters=[ID_PARAMETER], responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        deployment = self.deployment(request, pk)
        services.delete_band(get_object_or_404(RatioBand, deployment=deployment))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RatioBandFromAdviceView(_OnDeployment):
    """Set the P:D ratio band to the splits the topology advisor predicts best for a load
    (within 5 % of the best split's goodput): the recorded window or a synthetic profile, as
    the advice takes it."""

    team_roles = {"post": Role.OPERATOR}
    serializer_class = LoadQuerySerializer

    @extend_schema(parameters=[ID_PARAMETER], request=LoadQuerySerializer,
                   responses={200: AdvisedBandSerializer,
                              409: OpenApiResponse(description="no advice to draw a band from; "
                                                               "`advice` says why")})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self.deployment(request, pk)
        body = LoadQuerySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        form = LoadForm(body.validated_data)
        if not form.is_valid():
            return Response(advice_services.form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        try:
            band, splits = advised_band.band_from_advice(deployment, form)
        except LoadUnavailable as exc:
            return Response(advice_services.unavailable(exc), status=status.HTTP_400_BAD_REQUEST)
        except advised_band.BandRefused as exc:
            return Response({exc.field: [str(exc)]}, status=status.HTTP_409_CONFLICT)
        return Response({**RatioBandSerializer(band).data, "splits": splits})


class DecisionList(generics.ListAPIView):
    """The autoscaler's decisions for the deployment, newest first: each one's inputs, the
    count it computed, and what was done or why nothing was."""

    serializer_class = DecisionSerializer
    permission_classes = [TeamRole]

    def get_queryset(self) -> QuerySet[ScalingDecision]:
        deployment = get_object_or_404(visible(Deployment.objects.all(), self.request.user),
                                       pk=self.kwargs["pk"])
        rows = ScalingDecision.objects.filter(deployment=deployment)
        params = self.request.query_params
        if role := params.get("role"):
            if role not in PoolPolicy.Role.values:
                raise ValidationError({"role": [f"one of {', '.join(PoolPolicy.Role.values)}, "
                                                f"got {role!r}"]})
            rows = rows.filter(role=role)
        if reason := params.get("reason"):
            if reason not in REASONS:
                raise ValidationError({"reason": [f"one of {', '.join(REASONS)}, got {reason!r}"]})
            rows = rows.filter(reason=reason)
        return rows.order_by("-at", "-pk")

    @extend_schema(parameters=[
        ID_PARAMETER,
        OpenApiParameter("role", str, enum=list(PoolPolicy.Role.values)),
        OpenApiParameter("reason", str, enum=list(REASONS))])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)
