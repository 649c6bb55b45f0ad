from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets

from console.accounts.permissions import TeamRole
from console.query_params import MAX_ID, bounded_int
from console.supervisor.api.serializers import ProcessRowSerializer
from console.supervisor.models import ManagedProcess
from console.supervisor.visibility import team_of, visible_processes


@extend_schema_view(list=extend_schema(parameters=[OpenApiParameter(
    "deployment", {"type": "integer", "minimum": 1, "maximum": MAX_ID},
    description="only this deployment's processes")]))
class ProcessViewSet(viewsets.ReadOnlyModelViewSet):
    """The process table: every child process the supervisor runs on this node, read only
    (a deployment's start and stop, and the requesters of the other kinds, change it)."""

    serializer_class = ProcessRowSerializer
    permission_classes = [TeamRole]

    def team_id_of(self, process: ManagedProcess) -> int | None:
        return team_of(process)

    def get_queryset(self) -> QuerySet[ManagedProcess]:
        rows = visible_processes(ManagedProcess.objects.select_related("deployment"),
                                 self.request.user)
        deployment = self.request.query_params.get("deployment")
        if deployment is None or self.action != "list":
            return rows
        return rows.filter(deployment_id=bounded_int(deployment, "deployment", 1, MAX_ID))
