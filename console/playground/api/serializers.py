"""The playground's chat request: OpenAI's chat fields that the playground forwards."""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# An attached image as the browser reads it (FileReader.readAsDataURL). Only data URLs: a URL
# to fetch would make the workers fetch what a user names.
IMAGE_DATA_URL = re.compile(r"data:image/(png|jpeg|gif|webp|bmp);base64,(.+)", re.DOTALL)
TEXT_PART = {"type": "object", "required": ["type", "text"], "properties": {
    "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "properties": {
    "type": {"type": "string", "enum": ["image_url"]},
    "image_url": {"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "description": "data:image/<png|jpeg|gif|webp|bmp>;base64,..."},
        "detail": {"type": "string", "enum": ["auto", "low", "high"]}}}}}


@extend_schema_field({"oneOf": [{"type": "string"},
                                {"type": "array", "minItems": 1,
                                 "items": {"oneOf": [TEXT_PART, IMAGE_PART]}}]})
class ContentField(serializers.Field):
    """A message's text, or OpenAI's content parts: text parts and images as data URLs."""

    def to_internal_value(self, data: Any) -> str | list[dict[str, Any]]:
        if isinstance(data, str):
            return data
        if not isinstance(data, list) or not data:
            raise serializers.ValidationError("expected a string or a non-empty list of content "
                                              "parts")
        return [self._part(n, part) for n, part in enumerate(data)]

    def to_representation(self, value: Any) -> Any:
        return value

    @staticmethod
    def _part(n: int, part: Any) -> dict[str, Any]:
        where = f"part {n}"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            if set(part) != {"type", "text"} or not isinstance(part["text"], str):
                raise serializers.ValidationError(f"{where}: a text part is "
                                                  '{"type": "text", "text": "..."}')
            return {"type": "text", "text": part["text"]}
        if kind == "image_url":
            image = part.get("image_url")
            if set(part) != {"type", "image_url"} or not isinstance(image, Mapping) \
                    or not set(image) <= {"url", "detail"} or not isinstance(image.get("url"), str):
                raise serializers.ValidationError(f"{where}: an image part is {{\"type\": "
                                                  '"image_url", "image_url": {"url": "data:..."}}')
            _check_data_url(where, image["url"])
            return {"type": "image_url", "image_url": dict(image)}
        raise serializers.ValidationError(f"{where}: type must be text or image_url")


def _check_data_url(where: str, url: str) -> None:
    """Once per image: decodes it, which a 4 MiB image takes a few milliseconds for."""
    found = IMAGE_DATA_URL.fullmatch(url)
    if found is None:
        raise serializers.ValidationError(
            f"{where}: the image must be a data URL, data:image/<png|jpeg|gif|webp|bmp>;base64,"
            f"... (got {url[:40]!r})")
    try:
        binascii.a2b_base64(found.group(2).encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise serializers.ValidationError(f"{where}: the image's base64 is broken: {exc}") \
            from exc


class MessageSerializer(serializers.Serializer):
    role = serializers.CharField(help_text="system, user or assistant")
    content = ContentField(help_text="text, or content parts (text and images as data URLs: "
                                     "only in a user's message)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        content = attrs["content"]
        if isinstance(content, list) and attrs["role"] != "user" and any(
                part["type"] == "image_url" for part in content):
            raise serializers.ValidationError({"content": ["only a user's message may carry "
                                                           "images"]})
        return attrs


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
