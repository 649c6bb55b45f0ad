"""The troubleshooting view over REST: the eight symptoms of one deployment, evaluated now."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.diagnosis import services
from console.diagnosis.api.serializers import DoctorReportSerializer


@extend_schema(parameters=[ID_PARAMETER], responses={200: DoctorReportSerializer})
@api_view(["GET"])
@permission_classes([TeamRole])
def deployment_doctor(request: Request, pk: int) -> Response:
    """Each symptom's state (not_seen, suspected, present), evidence, ranked causes and fixes."""
    deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
    return Response(services.report(deployment))
