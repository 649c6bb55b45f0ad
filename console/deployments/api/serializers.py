from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.accounts.models import Team
from console.catalog.models import BaseModel, Variant
from console.deployments.models import Deployment, WorkerPlan
from console.deployments.plans import (
    MAX_INSTANCES,
    InstanceInput,
    PlanInput,
    PoolInput,
    pool_errors,
)
from console.fleet.models import Node
from console.validators import validate_core_list, validate_port

POOL_FIELDS = ("prefill", "decode", "colocated")

# The plan's "gate" object in the API -> the plan's fields.
GATE_FIELDS = {"mode": "gate_mode", "prompts": "gate_prompts", "min_agreement": "gate_min_agreement",
               "max_mean_logprob_delta": "gate_max_mean_delta", "action": "gate_action"}


class GateSettingsSerializer(serializers.Serializer):
    """The output gate settings of a plan, as written."""

    mode = serializers.ChoiceField(choices=Deployment.GateMode.choices, required=False)
    prompts = serializers.IntegerField(min_value=1, max_value=16, required=False)
    min_agreement = serializers.FloatField(min_value=0.0, max_value=1.0, required=False)
    max_mean_logprob_delta = serializers.FloatField(min_value=0.0, max_value=100.0, required=False)
    action = serializers.ChoiceField(choices=Deployment.GateAction.choices, required=False)


def plan_fields(gate: dict[str, Any]) -> dict[str, Any]:
    return {GATE_FIELDS[key]: value for key, value in gate.items()}




class WorkerPlanSerializer(serializers.ModelSerializer):
    variant = serializers.CharField(source="variant.name")
    variant_id = serializers.IntegerField()
    model_path = serializers.CharField(source="variant.path")
    node = serializers.CharField(source="node.name")

    class Meta:
        model = WorkerPlan
        fields = ["slot", "role", "index", "variant", "variant_id", "model_path", "node", "host",
                  "port", "side_channel_port", "cpu_cores", "gpu_indices", "share_devices"]


@extend_schema_field({"oneOf": [{"type": "integer"}, {"type": "string", "pattern": "^[^/]+/[^/]+$"}],
                     "description": 'a variant by id, or by "base/name"'})
class VariantField(serializers.RelatedField):
    """A variant by id, or by "base/name" as people write it."""

    default_error_messages = {
        "missing": "no variant {value!r}; list them at /api/v1/variants/",
        "invalid": 'expected a variant id or "base/name", got {value!r}',
    }

    def to_internal_value(self, data: object) -> Variant:
        variants = self.get_queryset()
        if isinstance(data, int) and not isinstance(data, bool):
            found = variants.filter(pk=data).first()
        elif isinstance(data, str) and data.count("/") == 1:
            base, name = data.split("/")
            found = variants.filter(base__name=base, name=name).first()
        else:
            self.fail("invalid", value=data)
        if found is None:
            self.fail("missing", value=data)
        return found

    def to_representation(self, value: Variant) -> int:
        return value.pk


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 65535})
class PortField(serializers.IntegerField):
    """A TCP port, its bounds stated in the schema and judged by the plan's own validator (the
    message the plan form shows too)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(validators=[validate_port], **kwargs)


class InstanceSerializer(serializers.Serializer):
    """One worker of a pool; what is left out is proposed (free ports, free devices)."""

    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all(),
                                        required=False)
    cpu_cores = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                      validators=[validate_core_list])
    gpu_indices = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                        validators=[validate_core_list])
    port = PortField(required=False)
    side_channel_port = PortField(required=False, allow_null=True)
    share_devices = serializers.BooleanField(required=False, default=False)


class PoolSerializer(serializers.Serializer):
    variant = VariantField(queryset=Variant.objects.select_related("base"))
    instances = InstanceSerializer(many=True, allow_empty=False, max_length=MAX_INSTANCES)


class RouterSerializer(serializers.Serializer):
    port = PortField(required=False)
    prefill_policy = serializers.ChoiceField(choices=Deployment.RoutingPolicy.choices,
                                             required=False)
    decode_policy = serializers.ChoiceField(choices=Deployment.RoutingPolicy.choices,
                                            required=False)
    pd_policy = serializers.ChoiceField(choices=Deployment.PDPolicy.choices, required=False)
    stall_budget_ms = serializers.IntegerField(required=False, min_value=1, max_value=60_000)
    degraded_mode = serializers.BooleanField(
        required=False, help_text=Deployment._meta.get_field("degraded_mode").help_text)


class PlanSerializer(serializers.ModelSerializer):
    """A plan as written: its fields, its pools and its router, in one request."""

    base_model = serializers.SlugRelatedField(slug_field="name", queryset=BaseModel.objects.all())
    team = serializers.SlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False,
        help_text="the owning team; on create, default: the one team where you are admin")
    prefill = PoolSerializer(required=False)
    decode = PoolSerializer(required=False)
    colocated = PoolSerializer(required=False)
    router = RouterSerializer(required=False)
    gate = GateSettingsSerializer(required=False)

    class Meta:
        model = Deployment
        # A template's whitespace is part of the prompts it renders.
        extra_kwargs = {"chat_template": {"trim_whitespace": False}}
        fields = ["name", "team", "base_model", "served_model_name", "mode", "max_model_len",
                  "longest_request", "concurrency", "ttft_slo_ms", "tpot_slo_ms", "kv_channel",
                  "kv_cache_gib", "block_size", "kv_cache_dtype", "kv_load_failure", "dtype",
                  "engine_version", "sampling_defaults", "tool_call_parser", "enable_auto_tool_choice",
                  "chat_template", "reasoning_parser", "extra_engine_args", "verify_after_start",
                  "max_images_per_prompt", "max_image_bytes", "max_image_pixels", "media_paths",
                  "media_domains",
                  "prefill",
                  "decode", "colocated", "router", "gate"]

    def validate_name(self, name: str) -> str:
        if self.instance is not None and name != self.instance.name:
            raise serializers.ValidationError(
                "cannot be changed: it names the deployment's logs and KV directory")
        return name

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not self.partial:
            # A partial update is checked against the stored pools when it is saved.
            mode = attrs.get("mode", Deployment.Mode.PD)
            errors = pool_errors(mode, _pools(attrs))
            if errors:
                raise serializers.ValidationError(errors)
        return attrs

    def to_plan_input(self) -> PlanInput:
        data = dict(self.validated_data)
        pools = _pools(data)
        for role in POOL_FIELDS:
            data.pop(role, None)
        router = data.pop("router", {})
        if "port" in router:
            data["router_port"] = router["port"]
        for key in ("prefill_policy", "decode_policy", "pd_policy", "stall_budget_ms",
                    "degraded_mode"):
            if key in router:
                data[key] = router[key]
        data.update(plan_fields(data.pop("gate", {})))
        return PlanInput(fields=data, pools=pools, partial=self.partial)


def _pools(attrs: dict[str, Any]) -> dict[str, PoolInput]:
    return {role: PoolInput(variant=attrs[role]["variant"],
                            instances=[InstanceInput(**i) for i in attrs[role]["instances"]])
            for role in POOL_FIELDS if role in attrs}
