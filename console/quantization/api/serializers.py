from __future__ import annotations

from typing import Any

from rest_framework import serializers

from console.catalog.models import BaseModel, QuantizationJob, Variant
from inference.quantization.options import DEFAULT_SAMPLES, METHODS, SCHEMES


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
