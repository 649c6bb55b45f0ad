from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.catalog.api.serializers import (
    BaseModelSerializer,
    RegisterVariantSerializer,
    VariantSerializer,
)
from console.catalog.models import BaseModel, Variant
from console.catalog.services import RegistrationError, register_variant, reinspect


class BaseModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                       viewsets.GenericViewSet):
    queryset = BaseModel.objects.all()
    serializer_class = BaseModelSerializer


class VariantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     viewsets.GenericViewSet):
    """Variants: register a directory (it is inspected, then hashed in the background)."""

    def get_queryset(self) -> QuerySet[Variant]:
        variants = Variant.objects.select_related("base")
        base = self.request.query_params.get("base")
        return variants.filter(base__name=base) if base else variants

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return RegisterVariantSerializer if self.action == "create" else VariantSerializer

    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        form = self.get_serializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            variant = register_variant(**form.validated_data)
        except RegistrationError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return Response(VariantSerializer(variant).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def inspect(self, request: Request, pk: str | None = None) -> Response:
        """Read the directory again (after its files changed) and hash it anew."""
        return Response(VariantSerializer(reinspect(self.get_object())).data)
