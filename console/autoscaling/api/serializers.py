"""Pool policies, the ratio band and decisions in the API."""

from __future__ import annotations

from rest_framework import serializers

from console.autoscaling.models import PoolPolicy, RatioBand, ScalingDecision, Signal
from console.autoscaling.services import EDITABLE


class PolicySerializer(serializers.ModelSerializer):
    signal = serializers.ChoiceField(choices=Signal.choices, required=False)
    scale_up_at = serializers.FloatField(required=False, min_value=0.0,
                                         help_text="default: the signal's (see the README)")
    scale_down_at = serializers.FloatField(required=False, min_value=0.0,
                                           help_text="default: the signal's")

    class Meta:
        model = PoolPolicy
        fields = ["role", *EDITABLE, "updated"]
        read_only_fields = ["role", "updated"]


class RatioBandSerializer(serializers.ModelSerializer):
    class Meta:
        model = RatioBand
        fields = ["min_ratio", "max_ratio"]


class AdvisedBandSerializer(RatioBandSerializer):
    splits = serializers.ListField(child=serializers.CharField(), read_only=True,
                                   help_text="the P:D splits the band spans, best first")

    class Meta(RatioBandSerializer.Meta):
        fields = ["min_ratio", "max_ratio", "splits"]


class DecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScalingDecision
        fields = ["id", "role", "at", "last_at", "evaluations", "signal", "value", "inputs",
                  "current", "desired", "target", "action", "reason", "detail", "dry_run",
                  "slots", "progress"]
        read_only_fields = fields


# Not "PoolSerializer": the plan's pools have that name, and the schema names a component by it.
class PoolStateSerializer(serializers.Serializer):
    role = serializers.CharField()
    current = serializers.IntegerField(help_text="instances in the plan")
    ready = serializers.IntegerField(help_text="of those, ready")
    desired = serializers.IntegerField(allow_null=True,
                                       help_text="what the latest decision asked for")
    policy = PolicySerializer(allow_null=True)
    latest = DecisionSerializer(allow_null=True)


class AutoscalingSerializer(serializers.Serializer):
    pools = PoolStateSerializer(many=True)
    ratio_band = RatioBandSerializer(allow_null=True)
