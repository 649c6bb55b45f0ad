from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts import services
from console.accounts.api.serializers import (
    MemberRoleSerializer,
    MemberSerializer,
    NewMemberSerializer,
    TeamSerializer,
    UserSerializer,
)
from console.accounts.models import Membership, Role, Team
from console.accounts.permissions import SuperuserOnly, SuperuserOnObject, TeamRole
from console.accounts.roles import visible_teams

USER_ID_PARAMETER = OpenApiParameter("user_id", int, OpenApiParameter.PATH,
                                     description="the member's user id")


class ConflictError(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def _conflict(exc: services.Conflict) -> ConflictError:
    return ConflictError(str(exc))


class TeamViewSet(viewsets.ModelViewSet):
    """Teams: everyone lists the teams they are in (a superuser: all); a superuser creates and
    deletes them; a team's admins edit it and its members."""

    serializer_class = TeamSerializer
    team_id_of = staticmethod(lambda team: team.pk)

    def get_permissions(self) -> list[BasePermission]:
        if self.action == "create":
            return [SuperuserOnly()]
        if self.action == "destroy":
            return [SuperuserOnObject()]
        return [TeamRole()]

    def get_queryset(self) -> QuerySet[Team]:
        return visible_teams(self.request.user)

    def perform_create(self, serializer: TeamSerializer) -> None:  # type: ignore[override]
        serializer.instance = services.create_team(**serializer.validated_data)

    def perform_update(self, serializer: TeamSerializer) -> None:  # type: ignore[override]
        try:
            serializer.instance = services.edit_team(serializer.instance,
                                                     serializer.validated_data)
        except services.Conflict as exc:
            raise _conflict(exc) from exc

    def perform_destroy(self, instance: Team) -> None:
        try:
            services.delete_team(instance)
        except services.Conflict as exc:
            raise _conflict(exc) from exc

    def _member(self, user_id: str) -> Membership:
        return get_object_or_404(Membership.objects.select_related("team", "user"),
                                 team=self.get_object(), user_id=int(user_id))

    @extend_schema(methods=["GET"], responses=MemberSerializer(many=True))
    @extend_schema(methods=["POST"], request=NewMemberSerializer,
                   responses={201: MemberSerializer})
    @action(detail=True, methods=["get", "post"], serializer_class=MemberSerializer)
    def members(self, request: Request, pk: str | None = None) -> Response:
        """The team's members and their roles; POST adds one (team admins)."""
        team = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(team.memberships.select_related("user"))
            return self.get_paginated_response(MemberSerializer(page, many=True).data)
        new = NewMemberSerializer(data=request.data)
        new.is_valid(raise_exception=True)
        try:
            member = services.add_member(team, new.validated_data["user"],
                                         Role(new.validated_data["role"]))
        except services.Conflict as exc:
            raise _conflict(exc) from exc
        return Response(MemberSerializer(member).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[USER_ID_PARAMETER], methods=["PATCH"],
                   request=MemberRoleSerializer, responses=MemberSerializer)
    @extend_schema(parameters=[USER_ID_PARAMETER], methods=["DELETE"], responses={204: None})
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<user_id>[0-9]+)",
            serializer_class=MemberSerializer)
    def member(self, request: Request, pk: str | None = None, user_id: str = "") -> Response:
        """Change a member's role, or remove them (team admins). A team keeps one admin at
        least: the change that would leave none is refused with 409."""
        member = self._member(user_id)
        try:
            if request.method == "DELETE":
                services.remove_member(member)
                return Response(status=status.HTTP_204_NO_CONTENT)
            change = MemberRoleSerializer(data=request.data)
            change.is_valid(raise_exception=True)
            member = services.change_role(member, Role(change.validated_data["role"]))
        except services.Conflict as exc:
            raise _conflict(exc) from exc
        return Response(MemberSerializer(member).data)


class UserViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, viewsets.GenericViewSet):
    """Users (superusers only). A user is deactivated (``is_active`` false), never deleted, so
    that the audit entries keep naming them."""

    serializer_class = UserSerializer
    permission_classes = [SuperuserOnly]
    # PATCH changes what it names; a PUT would have to send the password again.
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> QuerySet[Any]:
        return get_user_model().objects.order_by("username")

    def perform_create(self, serializer: UserSerializer) -> None:  # type: ignore[override]
        data = dict(serializer.validated_data)
        data.pop("is_active")
        serializer.instance = services.create_user(data.pop("username"), data.pop("password"),
                                                   **data)

    def perform_update(self, serializer: UserSerializer) -> None:  # type: ignore[override]
        changes = {field: value for field, value in serializer.validated_data.items()
                   if field in services.USER_EDITABLE}
        try:
            serializer.instance = services.edit_user(serializer.instance, changes,
                                                     by=self.request.user)
        except services.Conflict as exc:
            raise _conflict(exc) from exc
