"""Revisions and rollouts in the API: read as stored, written as the services take them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.catalog.models import Variant
from console.deployments.api.serializers import GateSettingsSerializer, VariantField, plan_fields
from console.deployments.models import Deployment
from console.rollouts import revisions
from console.rollouts.models import AnalysisRun, Revision, Rollout, RolloutTransition
from console.rollouts.services import START_TIMEOUT_RANGE

# The revision's own fields a draft may change (the gate comes as one object).
DRAFT_FIELDS = ("mode", "dtype", "kv_channel", "block_size", "kv_cache_dtype", "kv_cache_gib",
                "kv_load_failure", "sampling_defaults", "extra_engine_args", "engine_version",
                "max_images_per_prompt")
ANALYSES_SHOWN = 50


class RevisionSerializer(serializers.ModelSerializer):
    state = serializers.CharField(read_only=True, help_text="draft, live, retired or failed")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)
    changes = serializers.SerializerMethodField(
        help_text="{field: [before, after]} against the previous revision; null for the first")

    class Meta:
        model = Revision
        fields = ["id", "number", "state", "note", "created", "created_by", "spec", "changes"]
        read_only_fields = fields

    @extend_schema_field({"type": "object", "nullable": True,
                          "additionalProperties": {"type": "array", "items": {}}})
    def get_changes(self, revision: Revision) -> dict[str, list[Any]] | None:
        specs: dict[int, dict[str, Any]] = self.context.get("specs") or {}
        if not specs:
            previous = (Revision.objects.filter(deployment=revision.deployment_id,
                                                number__lt=revision.number)
                        .order_by("-number").first())
            return revisions.diff(previous.spec, revision.spec) if previous else None
        earlier = [n for n in specs if n < revision.number]
        if not earlier:
            return None
        return revisions.diff(specs[max(earlier)], revision.spec)


class DraftedRevisionSerializer(RevisionSerializer):
    checks = serializers.DictField(read_only=True, help_text="the pre-flight checks of the "
                                   "draft as the deployment API shows a plan's: ok, results, checks")

    class Meta(RevisionSerializer.Meta):
        fields = [*RevisionSerializer.Meta.fields, "checks"]
        read_only_fields = fields


class VariantsSerializer(serializers.Serializer):
    prefill = VariantField(queryset=Variant.objects.select_related("base"), required=False)
    decode = VariantField(queryset=Variant.objects.select_related("base"), required=False)
    colocated = VariantField(queryset=Variant.objects.select_related("base"), required=False)


class DraftSerializer(serializers.ModelSerializer):
    """A draft: the live revision with these fields and variants changed."""

    gate = GateSettingsSerializer(required=False)
    variants = VariantsSerializer(required=False,
                                  help_text='role -> a variant id or "base/name"')
    note = serializers.CharField(required=False, allow_blank=True, max_length=300, default="")

    class Meta:
        model = Deployment
        fields = [*DRAFT_FIELDS, "gate", "variants", "note"]
        extra_kwargs = {name: {"required": False} for name in DRAFT_FIELDS}

    def draft_input(self) -> tuple[dict[str, Any], dict[str, Variant], str]:
        data = dict(self.validated_data)
        note = data.pop("note", "")
        variants = dict(data.pop("variants", {}) or {})
        data.update(plan_fields(data.pop("gate", {}) or {}))
        return data, variants, note


class TransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutTransition
        fields = ["at", "from_state", "to_state", "actor", "reason", "weights"]
        read_only_fields = fields


class AnalysisRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = AnalysisRun
        fields = ["at", "step_index", "window_s", "verdict", "metrics", "requests"]
        read_only_fields = fields


class RolloutSerializer(serializers.ModelSerializer):
    deployment_name = serializers.CharField(source="deployment.name", read_only=True)
    from_revision = serializers.IntegerField(source="from_revision.number", read_only=True)
    to_revision = serializers.IntegerField(source="to_revision.number", read_only=True)
    state = serializers.CharField(read_only=True, help_text=", ".join(Rollout.State.values))
    paused_from = serializers.CharField(read_only=True, help_text="the state Resume returns to")
    strategy = serializers.CharField(read_only=True, help_text=", ".join(Rollout.Strategy.values))
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)
    transitions = TransitionSerializer(many=True, read_only=True)
    analyses = serializers.SerializerMethodField(help_text=f"the last {ANALYSES_SHOWN} windows")
    start_timeout_s = serializers.IntegerField(
        read_only=True, help_text="a green worker that makes no progress (no log line, no new "
                                  "phase) for this long rolls the rollout back")
    progress = serializers.JSONField(
        read_only=True, help_text='{"workers": {slot: {"phase", "phase_since", "progress_at", '
                                  '"started_at", "restarts", ...}}, "window": {"opened", '
                                  '"requests"}}: green\'s start and the window being collected')

    class Meta:
        model = Rollout
        fields = ["id", "deployment", "deployment_name", "from_revision", "to_revision",
                  "strategy", "state", "paused_from", "step_index", "steps", "weights",
                  "analysis", "failures", "gate", "verify_green", "verification", "reason",
                  "scale_down_delay_s", "drain_timeout_s", "start_timeout_s", "progress",
                  "state_since", "created_by",
                  "created", "finished", "transitions", "analyses"]
        read_only_fields = fields

    @extend_schema_field(AnalysisRunSerializer(many=True))
    def get_analyses(self, rollout: Rollout) -> list[dict[str, Any]]:
        runs = list(rollout.analyses.order_by("-at", "-pk")[:ANALYSES_SHOWN])
        return AnalysisRunSerializer(reversed(runs), many=True).data


class StartSerializer(serializers.Serializer):
    deployment = serializers.CharField(help_text="the deployment's id or name")
    revision = serializers.IntegerField(min_value=1, help_text="the revision's number")
    strategy = serializers.ChoiceField(choices=Rollout.Strategy.choices)
    steps = serializers.JSONField(required=False, allow_null=True,
                                  help_text='[{"weight": 10, "hold_s": 60}, ..., {"weight": 100}]')
    analysis = serializers.JSONField(required=False, allow_null=True,
                                     help_text="interval_s, failure_limit, min_requests, "
                                               "max_inconclusive_s, metrics")
    scale_down_delay_s = serializers.IntegerField(min_value=0, max_value=86_400, default=30)
    drain_timeout_s = serializers.IntegerField(min_value=1, max_value=86_400, default=120)
    start_timeout_s = serializers.IntegerField(
        min_value=START_TIMEOUT_RANGE[0], max_value=START_TIMEOUT_RANGE[1], required=False,
        allow_null=True, help_text="how long a green worker may make no progress (no log line, "
        "no new load phase) before the rollout rolls back; counted from its last progress. "
        "Default: 3 x the deployment's slowest recorded worker start, 300-3600 s (600 s "
        "without one)")
    verify_green = serializers.BooleanField(
        default=False, help_text="blue is drained only after a verification report of green "
        "alone (all the traffic on it) passed; one that does not pass rolls back. Not with "
        "in_place")
