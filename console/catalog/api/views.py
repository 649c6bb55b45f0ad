from __future__ import annotations

from django.db.models import ProtectedError, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from console.accounts.permissions import SuperuserChanges
from console.catalog.api.serializers import (
    BaseModelSerializer,
    RegisterVariantSerializer,
    RenameVariantSerializer,
    VariantSerializer,
)
from console.catalog.models import BaseModel, Variant
from console.catalog.services import (
    RegistrationError,
    create_base_model,
    delete_base_model,
    delete_variant,
    edit_base_model,
    protected_by,
    register_variant,
    reinspect_variant,
    rename_variant,
)

IN_USE = OpenApiResponse(description="still used: `detail` names by what")


def _in_use(what: str, exc: ProtectedError) -> Response:
    return Response({"detail": f"{what} is used by {protected_by(exc)}"},
                    status=status.HTTP_409_CONFLICT)


class BaseModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                       mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Base models: everyone signed in reads them, a superuser adds, edits and removes them."""

    queryset = BaseModel.objects.all()
    serializer_class = BaseModelSerializer
    permission_classes = [SuperuserChanges]

    def perform_create(self, serializer: BaseModelSerializer) -> None:  # type: ignore[override]
        serializer.instance = create_base_model(**serializer.validated_data)

    def perform_update(self, serializer: BaseModelSerializer) -> None:  # type: ignore[override]
        serializer.instance = edit_base_model(serializer.instance, dict(serializer.validated_data))

    @extend_schema(responses={204: None, 409: IN_USE})
    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        model = self.get_object()
        try:
            delete_base_model(model)
        except ProtectedError as exc:
            return _in_use(f"model {model}", exc)
        return Response(status=status.HTTP_204_NO_CONTENT)


class VariantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                     mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Variants: register a directory (it is inspected, then hashed in the background), rename
    or forget one (its directory stays on disk). Changes are a superuser's."""

    permission_classes = [SuperuserChanges]

    def get_queryset(self) -> QuerySet[Variant]:
        variants = Variant.objects.select_related("base")
        base = self.request.query_params.get("base")
        return variants.filter(base__name=base) if base else variants

    def get_serializer_class(self) -> type[serializers.Serializer]:
        if self.action == "create":
            return RegisterVariantSerializer
        if self.action in ("update", "partial_update"):
            return RenameVariantSerializer
        return VariantSerializer

    def create(self, request: Request, *args: object, **kwargs: object) -> Response:
        form = self.get_serializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            variant = register_variant(**form.validated_data)
        except RegistrationError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return Response(VariantSerializer(variant).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=VariantSerializer)
    def update(self, request: Request, *args: object, **kwargs: object) -> Response:
        variant = self.get_object()
        form = self.get_serializer(variant, data=request.data, partial=kwargs.get("partial", False))
        form.is_valid(raise_exception=True)
        if "name" in form.validated_data:
            variant = rename_variant(variant, form.validated_data["name"])
        return Response(VariantSerializer(variant).data)

    @extend_schema(responses={204: None, 409: IN_USE})
    def destroy(self, request: Request, *args: object, **kwargs: object) -> Response:
        variant = self.get_object()
        try:
            delete_variant(variant)
        except ProtectedError as exc:
            return _in_use(f"variant {variant}", exc)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def inspect(self, request: Request, pk: str | None = None) -> Response:
        """Read the directory again (after its files changed) and hash it anew."""
        return Response(VariantSerializer(reinspect_variant(self.get_object())).data)
