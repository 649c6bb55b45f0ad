from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.deployments.api.serializers import DeploymentSerializer
from console.deployments.models import Deployment
from console.deployments.services import request_state


class DeploymentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeploymentSerializer

    def get_queryset(self) -> QuerySet[Deployment]:
        return Deployment.objects.select_related("base_model").prefetch_related(
            "workers__variant", "processes"
        )

    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        deployment = request_state(self.get_object(), Deployment.DesiredState.RUNNING)
        return Response(self.get_serializer(deployment).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        deployment = request_state(self.get_object(), Deployment.DesiredState.STOPPED)
        return Response(self.get_serializer(deployment).data, status=status.HTTP_202_ACCEPTED)
