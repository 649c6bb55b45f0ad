from __future__ import annotations

from rest_framework import serializers

from console.advisor.models import SpeedProfile
from console.rollouts.models import Rollout


class LoadQuerySerializer(serializers.Serializer):
    """The load: a recorded window (default the last hour), or a synthetic profile."""

    window = serializers.ChoiceField(choices=["hour", "day"], required=False)
    rate_per_s = serializers.FloatField(required=False, min_value=0.001, max_value=10_000)
    prompt_tokens = serializers.CharField(required=False, max_length=8000,
                                          help_text="a length or comma-separated lengths")
    output_tokens = serializers.CharField(required=False, max_length=8000)


class ApplySerializer(LoadQuerySerializer):
    strategy = serializers.ChoiceField(choices=Rollout.Strategy.choices, default="blue_green")


class SpeedProfileSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name")
    variant = serializers.CharField(source="variant.__str__")
    # Plain text: an enum would collide in the schema with the other jobs' states.
    state = serializers.CharField(help_text="queued, running, done or failed")

    class Meta:
        model = SpeedProfile
        fields = ["id", "node", "variant", "state", "progress", "speeds", "error", "created",
                  "finished_at"]


class CandidateSerializer(serializers.Serializer):
    topology = serializers.CharField()
    mode = serializers.CharField()
    servers = serializers.DictField(child=serializers.IntegerField())
    current = serializers.BooleanField()
    goodput_rps = serializers.FloatField()
    slo_attained = serializers.FloatField()
    ttft_ms = serializers.DictField(child=serializers.FloatField())
    tpot_ms = serializers.DictField(child=serializers.FloatField())
    confidence = serializers.DictField()


class AdviceSerializer(serializers.Serializer):
    deployment = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["advised", "not_measured", "unusable", "no_plan"])
    detail = serializers.CharField(required=False)
    load = serializers.CharField()
    slo = serializers.DictField()
    node = serializers.CharField(required=False)
    variant = serializers.CharField(required=False)
    devices = serializers.IntegerField(required=False)
    current = serializers.CharField(required=False)
    recommended = serializers.CharField(required=False)
    switch = serializers.BooleanField(required=False)
    candidates = CandidateSerializer(many=True)
    measurement = SpeedProfileSerializer(required=False, allow_null=True)


class AppliedSerializer(serializers.Serializer):
    revision = serializers.IntegerField(help_text="the draft revision's number")
    rollout = serializers.IntegerField(help_text="the rollout's id")
    topology = serializers.CharField()
