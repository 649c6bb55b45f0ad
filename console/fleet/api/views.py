from __future__ import annotations

from django.db.models import ProtectedError, QuerySet
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.permissions import SuperuserChanges
from console.fleet.api.serializers import NodeSerializer
from console.fleet.models import Node
from console.fleet.services import delete_manual_node, discover_local_node, save_manual_node


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Nodes: everyone signed in reads them, a superuser adds, edits, removes and rediscovers
    them (they are every team's)."""

    serializer_class = NodeSerializer
    permission_classes = [SuperuserChanges]

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.prefetch_related("gpus").select_related("agent")

    def perform_create(self, serializer: NodeSerializer) -> None:  # type: ignore[override]
        serializer.instance = save_manual_node(None, serializer.to_model_fields())

    def perform_update(self, serializer: NodeSerializer) -> None:  # type: ignore[override]
        serializer.instance = save_manual_node(self._manual(), serializer.to_model_fields())

    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        node = self._manual()
        try:
            delete_manual_node(node)
        except ProtectedError as exc:
            users = sorted({str(w.deployment) for w in exc.protected_objects})
            return Response({"detail": f"node {node.name} is used by deployment(s) "
                                       f"{', '.join(users)}; move their workers first"},
                            status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=False, methods=["post"])
    def discover(self, request: Request) -> Response:
        """Rediscover the local node now."""
        node = discover_local_node()
        return Response(self.get_serializer(node).data)

    def _manual(self) -> Node:
        node = self.get_object()
        if node.is_local:
            raise PermissionDenied("the local node is discovered, not edited: "
                                   "POST /api/v1/nodes/discover to refresh it")
        return node
