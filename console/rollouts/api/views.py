"""Revisions and rollouts: read by the team's viewers, made and moved by its operators."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import require, visible
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.rollouts import revisions, services
from console.rollouts.api.serializers import (
    DraftedRevisionSerializer,
    DraftSerializer,
    RevisionSerializer,
    RolloutSerializer,
    StartSerializer,
)
from console.rollouts.machine import TransitionRefused
from console.rollouts.models import Revision, Rollout

# A refusal naming one of these is about the request's input (400); any other is the
# deployment's state now (409).
INPUT_FIELDS = frozenset({"deployment", "revision", "strategy", "steps", "analysis",
                          "scale_down_delay_s", "drain_timeout_s", "start_timeout_s",
                          "verify_green"})

CONFLICT = OpenApiResponse(description="the rollout's state does not allow it; `detail` says why")


def refused(exc: services.RolloutRefused) -> Response:
    code = status.HTTP_400_BAD_REQUEST if exc.field in INPUT_FIELDS else status.HTTP_409_CONFLICT
    return Response({exc.field: [str(exc)]}, status=code)


def conflict(exc: TransitionRefused) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


def rollouts_of(user: Any) -> QuerySet[Rollout]:
    return visible(Rollout.objects.select_related(
        "deployment", "from_revision", "to_revision", "created_by").prefetch_related(
        "transitions"), user, "deployment__team")


def deployment_by_id_or_name(user: Any, value: str, field: str = "deployment") -> Deployment:
    """A deployment the user can see, by id or name; a 400 naming ``field`` otherwise."""
    deployments = visible(Deployment.objects.all(), user)
    found = (deployments.filter(pk=int(value)).first() if value.isdigit() and len(value) < 12
             else None) or deployments.filter(name=value).first()
    if found is None:
        raise ValidationError({field: [f"no deployment {value!r} in your teams"]})
    return found


class RevisionsView(APIView):
    """A deployment's revisions, newest first, each with what it changed against the previous;
    a POST makes a draft (the operator role)."""

    permission_classes = [TeamRole]
    team_roles = {"post": Role.OPERATOR}
    serializer_class = DraftSerializer

    def _deployment(self, request: Request, pk: int) -> Deployment:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        return deployment

    @extend_schema(parameters=[ID_PARAMETER], responses=RevisionSerializer(many=True))
    def get(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        rows = list(Revision.objects.filter(deployment=deployment).select_related("created_by"))
        specs = {r.number: r.spec for r in rows}
        return Response(RevisionSerializer(rows, many=True, context={"specs": specs}).data)

    @extend_schema(parameters=[ID_PARAMETER], request=DraftSerializer,
                   responses={201: DraftedRevisionSerializer})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        body = DraftSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields, variants, note = body.draft_input()
        # A Django ValidationError (keyed by field) is a 400 through console.api_errors.
        revision, report = revisions.create_draft(deployment, fields, variants, request.user, note)
        data = {**RevisionSerializer(revision).data, "checks": report.as_dict()}
        return Response(data, status=status.HTTP_201_CREATED)


class DeploymentRollbackView(APIView):
    """Roll the revision live before the current one out again (blue-green), in one call."""

    permission_classes = [TeamRole]
    team_roles = {"post": Role.OPERATOR}
    serializer_class = RolloutSerializer

    @extend_schema(parameters=[ID_PARAMETER], request=None,
                   responses={201: RolloutSerializer, 409: CONFLICT})
    def post(self, request: Request, pk: int) -> Response:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        try:
            rollout = services.rollback_to_previous(deployment, request.user)
        except services.RolloutRefused as exc:
            return refused(exc)
        return Response(RolloutSerializer(rollouts_of(request.user).get(pk=rollout.pk)).data,
                        status=status.HTTP_201_CREATED)


class RolloutViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Rollouts of your teams' deployments with their transitions and analysis windows; starting,
    pausing, resuming, promoting and rolling back need the operator role."""

    serializer_class = RolloutSerializer
    permission_classes = [TeamRole]
    team_roles = {"create": Role.OPERATOR, "pause": Role.OPERATOR, "resume": Role.OPERATOR,
                  "promote": Role.OPERATOR, "rollback": Role.OPERATOR}

    @staticmethod
    def team_id_of(rollout: Rollout) -> int:
        return rollout.deployment.team_id

    def get_serializer_class(self) -> type:
        return StartSerializer if self.action == "create" else RolloutSerializer

    def get_queryset(self) -> QuerySet[Rollout]:
        rows = rollouts_of(self.request.user)
        if self.action != "list":
            return rows
        params = self.request.query_params
        if wanted := params.get("deployment"):
            by_name = Q(deployment__name=wanted)
            rows = rows.filter(by_name | Q(deployment_id=int(wanted))
                               if wanted.isdigit() and len(wanted) < 12 else by_name)
        if state := params.get("state"):
            if state not in Rollout.State.values:
                raise ValidationError({"state": [f"one of {', '.join(Rollout.State.values)}, "
                                                 f"got {state!r}"]})
            rows = rows.filter(state=state)
        return rows

    @extend_schema(parameters=[
        OpenApiParameter("deployment", str, description="a deployment's name or id"),
        OpenApiParameter("state", str, enum=list(Rollout.State.values))])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def _read(self, rollout: Rollout) -> dict[str, Any]:
        return RolloutSerializer(rollouts_of(self.request.user).get(pk=rollout.pk)).data

    @extend_schema(request=StartSerializer, responses={201: RolloutSerializer, 409: CONFLICT})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = StartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        deployment = deployment_by_id_or_name(request.user, data["deployment"])
        require(request.user, deployment.team_id, Role.OPERATOR)
        revision = deployment.revisions.filter(number=data["revision"]).first()
        if revision is None:
            raise ValidationError({"revision": [f"{deployment.name} has no revision "
                                                f"r{data['revision']}"]})
        try:
            rollout = services.start(
                deployment, revision, data["strategy"], request.user, steps=data.get("steps"),
                analysis=data.get("analysis"), scale_down_delay_s=data["scale_down_delay_s"],
                drain_timeout_s=data["drain_timeout_s"],
                start_timeout_s=data.get("start_timeout_s"), verify_green=data["verify_green"])
        except services.RolloutRefused as exc:
            return refused(exc)
        return Response(self._read(rollout), status=status.HTTP_201_CREATED)

    def _move(self, mover: Any) -> Response:
        try:
            rollout = mover(self.get_object())
        except TransitionRefused as exc:
            return conflict(exc)
        return Response(self._read(rollout))

    @extend_schema(request=None, responses={200: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        """Hold the weights where they are; nothing advances until it is resumed."""
        return self._move(services.pause)

    @extend_schema(request=None, responses={200: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Go on from the state the pause interrupted; the step's hold starts again."""
        return self._move(services.resume)

    @extend_schema(request=None, responses={200: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Skip the remaining steps and analysis: green takes all the traffic now."""
        return self._move(services.promote)

    @extend_schema(request=None, responses={200: RolloutSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, pk: str | None = None) -> Response:
        """Green's weight goes to 0 and green drains; blue serves everything."""
        return self._move(lambda rollout: services.rollback(
            rollout, f"rolled back by {request.user.get_username()}"))
