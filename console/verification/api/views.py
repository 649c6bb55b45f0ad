from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.models import Role
from console.accounts.permissions import TeamRole
from console.accounts.roles import visible
from console.api_router import ID_PARAMETER
from console.deployments.models import Deployment
from console.verification import services
from console.verification.api.serializers import VerificationSerializer, VerifyRequestSerializer
from console.verification.html_export import render_report
from console.verification.models import VerificationReport


class DeploymentVerificationsView(GenericAPIView):
    """GET: a deployment's verification reports, newest first (the team's). POST: verify it now
    (202 with the queued report; the team's operators)."""

    permission_classes = [TeamRole]
    team_roles = {"post": Role.OPERATOR}
    serializer_class = VerificationSerializer

    def _deployment(self, request: Request, pk: int) -> Deployment:
        deployment = get_object_or_404(visible(Deployment.objects.all(), request.user), pk=pk)
        self.check_object_permissions(request, deployment)
        return deployment

    @extend_schema(parameters=[ID_PARAMETER], responses=VerificationSerializer(many=True))
    def get(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        page = self.paginate_queryset(deployment.verifications.select_related(
            "deployment", "requested_by"))
        return self.get_paginated_response(VerificationSerializer(page, many=True).data)

    @extend_schema(parameters=[ID_PARAMETER], request=VerifyRequestSerializer, responses={
        202: VerificationSerializer,
        409: OpenApiResponse(description="a verification cannot run now; `detail` says why")})
    def post(self, request: Request, pk: int) -> Response:
        deployment = self._deployment(request, pk)
        body = VerifyRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            report = services.queue_verification(
                deployment, VerificationReport.Trigger.DEMAND, budget_s=data["budget_s"],
                run_options=services.options(data["lengths"], data["concurrencies"],
                                             data["stress_s"]),
                user=request.user)
        except services.VerificationRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(VerificationSerializer(report).data, status=status.HTTP_202_ACCEPTED)


class VerificationViewSet(viewsets.ReadOnlyModelViewSet):
    """Verification reports: a deployment's are its team's to read; the JSON is the export,
    ``export.html`` the self-contained HTML file."""

    serializer_class = VerificationSerializer
    permission_classes = [TeamRole]

    def team_id_of(self, report: VerificationReport) -> int:
        return report.deployment.team_id

    def get_queryset(self) -> QuerySet[VerificationReport]:
        return visible(VerificationReport.objects.select_related("deployment", "requested_by"),
                       self.request.user, team_field="deployment__team")

    @extend_schema(responses={(200, "text/html"): OpenApiResponse(
        OpenApiTypes.STR, description="the report as one HTML file: inline CSS and SVG charts, "
                                      "nothing loaded from elsewhere")})
    @action(detail=True, methods=["get"], url_path="export.html")
    def export_html(self, request: Request, pk: str) -> HttpResponse:
        report = self.get_object()
        response = HttpResponse(render_report(report), content_type="text/html; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="{report.deployment.name}-verification-{report.pk}.html"')
        return response
