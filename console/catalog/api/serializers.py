from __future__ import annotations

from typing import Any

from rest_framework import serializers

from console.catalog.models import BaseModel, QuantizationJob, Variant
from inference.quantization.options import DEFAULT_SAMPLES, METHODS, SCHEMES


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
                  "tokenizer_sha256", "tokenizer_files", "chat_template_sha256",
                  "generation_config", "inspected_at", "inspection_error", "hash"]

    def get_kv_geometry(self, variant: Variant) -> dict[str, Any]:
        return {"num_layers": variant.num_layers, "num_kv_heads": variant.num_kv_heads,
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


class QuantizationJobSerializer(serializers.ModelSerializer):
    """A quantization job as read: options, progress, log tail and outcome."""

    base_model = serializers.CharField(source="base.name")
    source = serializers.CharField(source="source.name", default=None)
    variant = serializers.SerializerMethodField()

    class Meta:
        model = QuantizationJob
        fields = ["id", "base_model", "source", "name", "path", "scheme", "method", "group_size",
                  "smoothing_strength", "samples", "state", "percent", "stage", "detail", "error",
                  "log_tail", "cancel_requested", "created_at", "started_at", "finished_at",
                  "build_seconds", "variant"]

    def get_variant(self, job: QuantizationJob) -> dict[str, Any] | None:
        if job.variant_id is None:
            return None
        return {"id": job.variant_id, "name": job.name}


class StartQuantizationSerializer(serializers.Serializer):
    """Starting a job: the base model, the scheme and its options; the rest has defaults."""

    base_model = serializers.SlugRelatedField(slug_field="name", queryset=BaseModel.objects.all())
    source = serializers.SlugField(required=False, help_text="variant to quantize (default: bf16)")
    scheme = serializers.ChoiceField(choices=SCHEMES)
    method = serializers.ChoiceField(choices=METHODS, required=False)
    group_size = serializers.IntegerField(required=False, allow_null=True)
    smoothing_strength = serializers.FloatField(required=False, allow_null=True)
    samples = serializers.IntegerField(required=False, default=DEFAULT_SAMPLES)
    name = serializers.SlugField(required=False, max_length=100, help_text="default: <scheme>-<method>")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if "source" in data:
            source = Variant.objects.filter(base=data["base_model"], name=data["source"]).first()
            if source is None:
                raise serializers.ValidationError(
                    {"source": [f"{data['base_model'].name} has no variant named {data['source']}"]})
            data["source"] = source
        return data
