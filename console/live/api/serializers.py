"""The shapes of the live app's answers, for the OpenAPI schema: the views write these
objects themselves (tests/console/test_openapi_schema.py holds them to these shapes)."""

from __future__ import annotations

from rest_framework import serializers

from console.live.models import MetricSample


class LogLineSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="the line's number within its process, from 1")
    created = serializers.DateTimeField()
    text = serializers.CharField()


class LogPageSerializer(serializers.Serializer):
    process = serializers.IntegerField()
    slot = serializers.CharField()
    lines = LogLineSerializer(many=True)
    next_after = serializers.IntegerField(help_text="the `after` that asks for the next page")
    has_more = serializers.BooleanField()


class MetricPointSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    data = serializers.DictField(help_text="the deployment's metrics at that time, by name")


class MetricHistorySerializer(serializers.Serializer):
    deployment = serializers.IntegerField()
    window = serializers.CharField()
    resolution = serializers.ChoiceField(choices=MetricSample.Resolution.choices)
    step_s = serializers.IntegerField(help_text="seconds between two samples")
    samples = MetricPointSerializer(many=True)
