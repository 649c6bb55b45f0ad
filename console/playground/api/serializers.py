"""The playground's chat request: OpenAI's chat fields that the playground forwards."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


class MessageSerializer(serializers.Serializer):
    role = serializers.CharField(help_text="system, user or assistant")
    content = serializers.CharField(allow_blank=True, trim_whitespace=False)


@extend_schema_field({"oneOf": [{"type": "string"},
                                {"type": "array", "items": {"type": "string"}}]})
class StopField(serializers.Field):
    """A stop string or a list of them, as in OpenAI's API."""

    def to_internal_value(self, data: Any) -> str | list[str]:
        if isinstance(data, str) or (isinstance(data, list)
                                     and all(isinstance(item, str) for item in data)):
            return data
        raise serializers.ValidationError("expected a string or a list of strings")

    def to_representation(self, value: Any) -> Any:
        return value


class ChatRequestSerializer(serializers.Serializer):
    """The conversation so far and the sampling settings; the console adds the model and asks
    for a stream with usage. Any other field is refused, named."""

    messages = MessageSerializer(many=True, allow_empty=False)
    max_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    temperature = serializers.FloatField(required=False, allow_null=True, min_value=0)
    top_p = serializers.FloatField(required=False, allow_null=True, min_value=0, max_value=1)
    seed = serializers.IntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, Mapping):
            raise serializers.ValidationError({"body": ["expected a JSON object"]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {name: [f"unsupported field; allowed: {sorted(self.fields)}"] for name in unknown})
        return super().to_internal_value(data)
