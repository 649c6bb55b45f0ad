from __future__ import annotations

from typing import Any

from rest_framework import serializers

from console.deployments.api.serializers import GATE_FIELDS
from console.deployments.models import Deployment
from console.quality import services
from console.quality.models import GateResult, VariantMeasurement


class GateResultSerializer(serializers.ModelSerializer):
    deployment = serializers.CharField(source="deployment.name")
    thresholds = serializers.SerializerMethodField()
    totals = serializers.DictField()
    reasons = serializers.ListField(child=serializers.CharField())

    class Meta:
        model = GateResult
        fields = ["id", "deployment", "trigger", "state", "prompts", "thresholds", "action",
                  "reference", "totals", "reasons", "error", "report", "created", "started_at",
                  "finished_at"]

    def get_thresholds(self, gate: GateResult) -> dict[str, float]:
        return {"min_agreement": gate.min_agreement, "max_mean_logprob_delta": gate.max_mean_delta}


class GateStatusSerializer(serializers.Serializer):
    """A plan's gate settings, whether a start runs the gate, and why (``gate_settings()``)."""

    mode = serializers.ChoiceField(choices=Deployment.GateMode.choices)
    prompts = serializers.IntegerField()
    min_agreement = serializers.FloatField()
    max_mean_logprob_delta = serializers.FloatField()
    action = serializers.ChoiceField(choices=Deployment.GateAction.choices)
    runs_on_start = serializers.BooleanField()
    why = serializers.CharField()


class DeploymentGateSerializer(GateStatusSerializer):
    """A deployment's gate: its status, why it holds the router now ("" when it does not), the
    latest result and the recent ones (``gate_summary()`` and the view's ``results``)."""

    router_hold = serializers.CharField()
    latest = GateResultSerializer(allow_null=True)
    results = GateResultSerializer(many=True)


def gate_settings(deployment: Deployment) -> dict[str, Any]:
    """The plan's gate settings and whether a start runs it, and why (no query of its own)."""
    applies, reason = services.gate_applies(deployment)
    return {**{key: getattr(deployment, name) for key, name in GATE_FIELDS.items()},
            "runs_on_start": applies, "why": reason}


def gate_summary(deployment: Deployment) -> dict[str, Any]:
    """The settings, whether the gate holds the router now, and the latest result."""
    latest = services.latest_gate(deployment)
    return {**gate_settings(deployment), "router_hold": services.router_hold(deployment, latest),
            "latest": GateResultSerializer(latest).data if latest else None}


class MeasurementSerializer(serializers.ModelSerializer):
    variant = serializers.CharField(source="variant.__str__")
    variant_id = serializers.IntegerField()
    node = serializers.CharField(source="node.name")
    # None until the measurement's gate has run.
    agreement = serializers.FloatField(allow_null=True)
    mean_abs_logprob_delta = serializers.FloatField(source="mean_delta", allow_null=True)

    class Meta:
        model = VariantMeasurement
        fields = ["id", "variant", "variant_id", "node", "state", "dtype", "cores", "reference",
                  "prompt_tokens", "prefill_tps", "decode_tps", "agreement",
                  "mean_abs_logprob_delta", "gate", "error", "created", "finished_at"]
