from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings

from console.audit.api.renderers import CSVRenderer, JSONLinesRenderer
from console.audit.api.serializers import AuditEntrySerializer
from console.audit.forms import AuditFilterForm
from console.audit.models import AuditEntry
from console.audit.scope import visible_entries

EXPORT_RENDERERS: list[type[BaseRenderer]] = [JSONLinesRenderer, CSVRenderer]
EXPORT_FORMATS = [renderer.format for renderer in EXPORT_RENDERERS]


class ExportResponse(Response):
    """A page of the export. DRF drops the Content-Type of an empty body, but an empty page of
    JSON lines is still JSON lines (and the schema says so)."""

    @property
    def rendered_content(self) -> bytes:
        content = super().rendered_content
        if not content:
            self["Content-Type"] = f"{self.accepted_media_type}; charset={self.accepted_renderer.charset}"
        return content


def _filter_schema(field: forms.Field) -> dict[str, Any]:
    if isinstance(field, forms.DateTimeField):
        return {"type": "string", "format": "date-time"}
    return {"type": "string", "maxLength": field.max_length}


FILTER_PARAMETERS = [OpenApiParameter(name, _filter_schema(field), description=str(field.help_text))
                     for name, field in AuditFilterForm.base_fields.items()]
# The export pages as the lists do; the schema gives a list's paging parameters by itself.
PAGE_PARAMETERS = [
    OpenApiParameter(parameter["name"], parameter["schema"], description=parameter["description"])
    for parameter in api_settings.DEFAULT_PAGINATION_CLASS().get_schema_operation_parameters(None)
]
EXPORT_PARAMETERS = [
    OpenApiParameter("format", str, enum=EXPORT_FORMATS, default=EXPORT_FORMATS[0],
                     description="JSON lines (one entry a line) or CSV (a header row first)"),
    *PAGE_PARAMETERS,
]


@extend_schema_view(list=extend_schema(parameters=FILTER_PARAMETERS))
class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log, newest first: read only. A superuser reads every entry; anyone else the
    entries of their teams' objects and of their own changes."""

    serializer_class = AuditEntrySerializer

    def get_queryset(self) -> QuerySet[AuditEntry]:
        entries = visible_entries(self.request.user)
        if self.action in ("list", "export"):
            query = AuditFilterForm(self.request.query_params)
            if not query.is_valid():
                raise exceptions.ValidationError(
                    {name: list(messages) for name, messages in query.errors.items()})
            entries = query.filter(entries)
        return entries

    @extend_schema(
        parameters=[*FILTER_PARAMETERS, *EXPORT_PARAMETERS],
        responses={(200, renderer.media_type): OpenApiTypes.STR for renderer in EXPORT_RENDERERS},
        description="One page of the filtered log as JSON lines or CSV. The page's neighbours "
                    "are in the Link header (rel next and prev); X-Total-Count counts the "
                    "entries that match.")
    @action(detail=False, renderer_classes=EXPORT_RENDERERS)
    def export(self, request: Request) -> Response:
        entries = self.paginate_queryset(self.get_queryset())
        paginator = self.paginator
        links = [f'<{url}>; rel="{rel}"' for rel, url in
                 (("next", paginator.get_next_link()), ("prev", paginator.get_previous_link()))
                 if url]
        headers = {"X-Total-Count": str(paginator.count)}
        if links:
            headers["Link"] = ", ".join(links)
        return ExportResponse(self.get_serializer(entries, many=True).data, headers=headers)

    def get_renderer_context(self) -> dict[str, Any]:
        return {**super().get_renderer_context(),
                "columns": AuditEntrySerializer.Meta.fields}

    def perform_content_negotiation(self, request: Request,
                                    force: bool = False) -> tuple[BaseRenderer, str]:
        if self.action == "export" and not force:
            # Else DRF answers an unknown ?format= with a 404.
            wanted = request.query_params.get("format")
            if wanted is not None and wanted not in EXPORT_FORMATS:
                raise exceptions.ValidationError(
                    {"format": [f"expected one of {', '.join(EXPORT_FORMATS)}, got {wanted!r}"]})
        return super().perform_content_negotiation(request, force)

    def handle_exception(self, exc: Exception) -> Response:
        # An error is told in JSON, whatever format the export was asked in. A method the route
        # does not map has no action, but the export's renderers still apply to it: they turned
        # a 405 into a body of one word.
        if self.action in ("export", None):
            self.request.accepted_renderer = JSONRenderer()
            self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)
