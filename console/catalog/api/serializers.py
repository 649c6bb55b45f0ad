from __future__ import annotations

from typing import Any

from rest_framework import serializers

from console.catalog.models import BaseModel, Variant


class BaseModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = BaseModel
        fields = ["id", "name", "description"]


class VariantSerializer(serializers.ModelSerializer):
    """A variant as read: what inspection found and how far hashing got."""

    base_model = serializers.CharField(source="base.name")
    kv_geometry = serializers.SerializerMethodField()
    hash = serializers.SerializerMethodField()

    class Meta:
        model = Variant
        fields = ["id", "base_model", "name", "path", "format", "dtype", "quantization",
                  "architecture", "parameter_count", "size_bytes", "kv_geometry",
                  "modalities", "encoder_parameter_count", "processor_sha256", "processor_files",
                  "tokenizer_sha256", "tokenizer_files", "chat_template_sha256",
                  "generation_config", "inspected_at", "inspection_error", "hash"]

    def get_kv_geometry(self, variant: Variant) -> dict[str, Any]:
        return {"num_layers": variant.num_layers, "num_attention_heads": variant.num_attention_heads,
                "num_kv_heads": variant.num_kv_heads,
                "head_dim": variant.head_dim, "kv_dtype": variant.kv_dtype,
                "kv_dtype_from_checkpoint": variant.kv_dtype_from_checkpoint,
                "max_positions": variant.max_positions}

    def get_hash(self, variant: Variant) -> dict[str, Any]:
        return {"state": variant.hash_state, "percent": variant.hash_percent,
                "bytes_done": variant.hash_bytes_done, "bytes_total": variant.hash_bytes_total,
                "sha256": variant.weights_sha256, "files": variant.file_hashes,
                "error": variant.hash_error, "hashed_at": variant.hashed_at}


class RegisterVariantSerializer(serializers.ModelSerializer):
    """Registering a directory: the rest of the variant is read from it."""

    base_model = serializers.SlugRelatedField(slug_field="name", source="base",
                                              queryset=BaseModel.objects.all())

    class Meta:
        model = Variant
        fields = ["base_model", "name", "path"]


class RenameVariantSerializer(serializers.ModelSerializer):
    """A variant's name is all that changes by hand; what it is comes from its directory."""

    class Meta:
        model = Variant
        fields = ["name"]
