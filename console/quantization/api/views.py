from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.permissions import SuperuserChanges
from console.catalog.models import QuantizationJob
from console.quantization.api.serializers import QuantizationJobSerializer, StartQuantizationSerializer
from console.quantization.jobs import JobError, cancel_job, start_job


class QuantizationJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Quantization jobs: start one (202), follow it, cancel it. A build adds a variant to the
    catalog every team shares, so starting and cancelling are a superuser's."""

    permission_classes = [SuperuserChanges]

    def get_queryset(self) -> QuerySet[QuantizationJob]:
        # Read only: the supervise daemon fails jobs orphaned by a killed worker.
        found = QuantizationJob.objects.select_related("base", "source")
        base = self.request.query_params.get("base")
        return found.filter(base__name=base) if base else found

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return StartQuantizationSerializer if self.action == "create" else QuantizationJobSerializer

    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        form = self.get_serializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = dict(form.validated_data)
        try:
            job = start_job(data.pop("base_model"), **data)
        except JobError as exc:
            return _job_error(exc)
        return Response(QuantizationJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        try:
            job = cancel_job(self.get_object())
        except JobError as exc:
            return _job_error(exc)
        return Response(QuantizationJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


def _job_error(exc: JobError) -> Response:
    code = status.HTTP_409_CONFLICT if exc.conflict else status.HTTP_400_BAD_REQUEST
    return Response({exc.field: [str(exc)]}, status=code)
