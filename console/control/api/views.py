from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import team_to_create_in, visible
from console.control import lifecycle
from console.control.api.serializers import DeploymentSerializer
from console.deployments.api.serializers import PlanSerializer
from console.deployments.models import Deployment
from console.deployments.plans import PlanInput
from console.rollouts.models import Revision, Rollout


def refused(exc: lifecycle.Refused) -> Response:
    """409 with the check list: what the page shows too."""
    return Response({"detail": str(exc), **exc.report.as_dict()}, status=status.HTTP_409_CONFLICT)


def _save(plan: PlanInput, deployment: Deployment | None = None,
          user: Any = None) -> tuple[Deployment, dict]:
    try:
        saved, report = lifecycle.save(plan, deployment, user=user)
    except ValidationError as exc:
        # Values only the model can judge (after proposals), keyed like the request's fields.
        raise serializers.ValidationError(exc.message_dict) from exc
    return saved, report.as_dict()


class PlanEditDraftSerializer(serializers.Serializer):
    number = serializers.IntegerField(help_text="the draft revision's number")
    changes = serializers.DictField(child=serializers.ListField(), help_text=(
        "{field: [live, draft]}: the revision fields and variants (variant.<role>) the edit "
        "changed"))
    checks = serializers.DictField(help_text="the draft's pre-flight checks: ok, results, checks")


class PlanEditDraftedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    draft_revision = PlanEditDraftSerializer()
    live_edits_applied = serializers.BooleanField(help_text=(
        "whether the edit's live part (instances, devices, ports, router settings) was applied "
        "to the running plan"))


def drafted(exc: lifecycle.DraftMade) -> Response:
    """202: the edit of a running deployment became a draft revision to roll out."""
    number, deployment = exc.revision.number, exc.revision.deployment
    applied = ("its live edits (instances, devices, ports, router settings) are applied; "
               if exc.live_edits else "")
    detail = (f"{deployment.name} is running: the edit of {', '.join(exc.changes)} is draft "
              f"revision r{number}, not applied to the running workers; {applied}roll it out "
              f'with POST /api/v1/rollouts/ {{"deployment": {deployment.pk}, "revision": '
              f'{number}, "strategy": "canary"}} (or "blue_green")')
    return Response({"detail": detail, "live_edits_applied": exc.live_edits,
                     "draft_revision": {"number": number, "changes": exc.changes,
                                        "checks": exc.report.as_dict()}},
                    status=status.HTTP_202_ACCEPTED)


EDIT_RESPONSES = {
    200: PlanSerializer,
    202: OpenApiResponse(PlanEditDraftedSerializer, description=(
        "the deployment is running and the edit changes a revision field (mode, variants, "
        "engine, KV, sampling defaults, extra engine flags, gate): nothing of that is saved; a "
        "draft revision holds it, to roll out with POST /api/v1/rollouts/. The edit's live part "
        "(instances, devices, ports, router settings), if any, is applied.")),
    409: OpenApiResponse(description="the deployment runs and the edited plan fails a check: "
                                     "nothing is saved; `detail` and the check list"),
}


class DeploymentViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin,
                        viewsets.ReadOnlyModelViewSet):
    """Plans: read, create, edit and delete them (team admins); check, start and stop them (team
    operators)."""

    permission_classes = [TeamRole]
    team_roles = {"check": Role.OPERATOR, "start": Role.OPERATOR, "stop": Role.OPERATOR}

    def get_queryset(self) -> QuerySet[Deployment]:
        return visible(Deployment.objects.select_related("base_model", "team").prefetch_related(
            "workers__variant", "workers__node", "processes",
            # The live revision and the rollout in progress of each, in two queries for a list.
            Prefetch("revisions", to_attr="live_revisions",
                     queryset=Revision.objects.filter(state=Revision.State.LIVE)),
            Prefetch("rollouts", to_attr="active_rollouts",
                     queryset=Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES)
                     .select_related("from_revision", "to_revision")),
        ), self.request.user)

    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.action in ("create", "update", "partial_update", "check"):
            return PlanSerializer
        return DeploymentSerializer

    def _read(self, deployment: Deployment, **extra: object) -> dict:
        fresh = self.get_queryset().get(pk=deployment.pk)
        return {**DeploymentSerializer(fresh, context=self.get_serializer_context()).data, **extra}

    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        plan = self.get_serializer(data=request.data)
        plan.is_valid(raise_exception=True)
        data = plan.to_plan_input()
        try:
            data.fields["team"] = team_to_create_in(request.user, data.fields.get("team"),
                                                    Role.ADMIN)
        except ValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc
        deployment, checks = _save(data, user=request.user)
        return Response(self._read(deployment, checks=checks), status=status.HTTP_201_CREATED)

    @extend_schema(responses=EDIT_RESPONSES)
    def update(self, request: Request, *args: object, **kwargs: object) -> Response:
        deployment = self.get_object()
        plan = self.get_serializer(deployment, data=request.data, partial=kwargs.get("partial", False))
        plan.is_valid(raise_exception=True)
        moved_to = plan.validated_data.get("team")
        if moved_to is not None and moved_to.pk != deployment.team_id:
            # Moving a deployment takes admin in the team it goes to as well.
            team_to_create_in(request.user, moved_to, Role.ADMIN)
        try:
            deployment, checks = _save(plan.to_plan_input(), deployment, request.user)
        except lifecycle.Refused as exc:
            return refused(exc)
        except lifecycle.DraftMade as exc:
            return drafted(exc)
        return Response(self._read(deployment, checks=checks))

    @extend_schema(responses=EDIT_RESPONSES)
    def partial_update(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().partial_update(request, *args, **kwargs)

    @extend_schema(responses={204: None, 409: OpenApiResponse(
        description="it runs, or a process of it is alive; `detail` says which")})
    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        """Delete a stopped deployment with its processes' rows, keys file and KV directory."""
        try:
            lifecycle.delete(self.get_object())
        except lifecycle.StillRunning as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=True, methods=["post"])
    def check(self, request: Request, pk: str | None = None) -> Response:
        """The checks of the stored plan; with a body, of the plan as that body would change it."""
        deployment = self.get_object()
        if not request.data:
            return Response(lifecycle.check(deployment).as_dict())
        plan = self.get_serializer(deployment, data=request.data, partial=True)
        plan.is_valid(raise_exception=True)
        try:
            report = lifecycle.preview(plan.to_plan_input(), deployment)
        except ValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from exc
        return Response(report.as_dict())

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        deployment = self.get_object()
        try:
            report = lifecycle.start(deployment)
        except lifecycle.Refused as exc:
            return refused(exc)
        return Response(self._read(deployment, checks=report.as_dict()),
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        deployment = lifecycle.stop(self.get_object())
        return Response(self._read(deployment), status=status.HTTP_202_ACCEPTED)
