"""The advice of a deployment: read by the team's viewers; measuring and applying it need the
operator role."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.advisor import services, speed_runs, topology_drafts
from console.advisor.api.serializers import (
    AdviceSerializer,
    AppliedSerializer,
    ApplySerializer,
    SpeedProfileSerializer,
)
from console.advisor.forms import LoadForm
from console.advisor.load_sources import LoadUnavailable
from console.advisor.predictions import subject
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment

LOAD_PARAMETERS = [
    ID_PARAMETER,
    OpenApiParameter("window", str, enum=["hour", "day"],
                     description="the recorded load of this window (default: hour)"),
    OpenApiParameter("rate_per_s", float, description="a synthetic load's requests per second"),
    OpenApiParameter("prompt_tokens", str, description="synthetic: a length or lengths, comma-separated"),
    OpenApiParameter("output_tokens", str, description="synthetic: a length or lengths, comma-separated"),
]
CONFLICT = OpenApiResponse(description="nothing to apply or the rollout refused; `advice` or "
                                       "`strategy` says why")


class _OfDeployment(APIView):
    permission_classes = [TeamRole]

    def _deployment(self, request: Request, pk: int) -> Deployment:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        return deployment


class AdviceView(_OfDeployment):
    """Every topology the node's devices allow, ranked by predicted goodput under the plan's
    SLOs for the load, the current plan among them; without measured speeds, says so."""

    serializer_class = AdviceSerializer

    @extend_schema(parameters=LOAD_PARAMETERS, responses=AdviceSerializer)
    def get(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        form = LoadForm(request.query_params)
        if not form.is_valid():
            return Response(services.form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        # Read before the advice: a measurement shown done is then one the advice has seen.
        measurement = services.latest_measurement(deployment)
        try:
            advice = services.advice_for(deployment, form)
        except LoadUnavailable as exc:
            return Response(services.unavailable(exc), status=status.HTTP_400_BAD_REQUEST)
        advice["measurement"] = SpeedProfileSerializer(measurement).data if measurement else None
        return Response(advice)


class AdviceApplyView(_OfDeployment):
    """Make the draft revision of the recommended topology and start rolling it out."""

    team_roles = {"post": Role.OPERATOR}
    serializer_class = ApplySerializer

    @extend_schema(parameters=[ID_PARAMETER], request=ApplySerializer,
                   responses={201: AppliedSerializer, 409: CONFLICT})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        body = ApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        form = LoadForm({k: v for k, v in body.validated_data.items() if k != "strategy"})
        if not form.is_valid():
            return Response(services.form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        try:
            advice = services.advice_for(deployment, form)
            revision, rollout = topology_drafts.apply(deployment, advice, request.user,
                                                      body.validated_data["strategy"])
        except LoadUnavailable as exc:
            return Response(services.unavailable(exc), status=status.HTTP_400_BAD_REQUEST)
        except topology_drafts.ApplyRefused as exc:
            return Response({exc.field: [str(exc)]}, status=status.HTTP_409_CONFLICT)
        return Response({"revision": revision.number, "rollout": rollout.pk,
                         "topology": advice["recommended"]}, status=status.HTTP_201_CREATED)


class AdviceMeasureView(_OfDeployment):
    """Measure the speeds the advice needs: the plan's variant served alone on its node."""

    team_roles = {"post": Role.OPERATOR}
    serializer_class = SpeedProfileSerializer

    @extend_schema(parameters=[ID_PARAMETER], request=None,
                   responses={202: SpeedProfileSerializer, 409: CONFLICT})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        found = subject(deployment)
        if found is None:
            return Response({"deployment": ["the plan has no workers"]},
                            status=status.HTTP_409_CONFLICT)
        try:
            profile = speed_runs.queue(found.node, found.variant, request.user)
        except speed_runs.MeasureRefused as exc:
            return Response({exc.field: [str(exc)]}, status=status.HTTP_409_CONFLICT)
        return Response(SpeedProfileSerializer(profile).data, status=status.HTTP_202_ACCEPTED)
