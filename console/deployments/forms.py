"""The plan editor of the web console: the plan's fields, one pool per role, one row per instance.

It produces the same :class:`PlanInput` as the REST serializer, so both are saved and checked by
the same code (``services.save``).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db.models import QuerySet
from django.http import QueryDict

from console.accounts.models import Team
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.deployments.placement import Ledger
from console.deployments.plans import (
    MAX_INSTANCES,
    POOL_ROLES,
    InstanceInput,
    PlanInput,
    PoolInput,
    stored_pools,
)
from console.fleet.models import Node
from console.fleet.services import local_node
from console.validators import validate_core_list, validate_port

ROLES = ("prefill", "decode", "colocated")


class PlanForm(forms.ModelForm):
    class Meta:
        model = Deployment
        fields = ["name", "team", "base_model", "served_model_name", "mode", "max_model_len",
                  "longest_request", "concurrency", "ttft_slo_ms", "tpot_slo_ms", "kv_channel",
                  "kv_cache_gib", "block_size", "kv_cache_dtype", "kv_load_failure", "dtype",
                  "engine_version", "sampling_defaults", "router_port",
                  "prefill_policy", "decode_policy", "pd_policy", "stall_budget_ms",
                  "degraded_mode", "tool_call_parser", "enable_auto_tool_choice",
                  "reasoning_parser", "chat_template", "max_images_per_prompt",
                  "max_image_bytes", "max_image_pixels", "media_paths", "media_domains",
                  "gate_mode", "gate_prompts", "gate_min_agreement", "gate_max_mean_delta",
                  "gate_action", "verify_after_start"]
        labels = {"max_model_len": "Context length", "ttft_slo_ms": "TTFT SLO, p95 (ms)",
                  "tpot_slo_ms": "TPOT SLO, p95 (ms)", "kv_cache_gib": "KV cache size (GiB)",
                  "kv_cache_dtype": "KV cache dtype", "dtype": "Compute dtype",
                  "kv_channel": "Transfer channel", "block_size": "Block size",
                  "gate_mode": "Output gate", "gate_prompts": "Gate prompts",
                  "gate_min_agreement": "Gate: min top-1 agreement",
                  "gate_max_mean_delta": "Gate: max mean |Δ logprob|", "gate_action": "Gate action",
                  "verify_after_start": "Verify after start and promotion",
                  "degraded_mode": "Degraded mode", "tool_call_parser": "Tool-call parser",
                  "enable_auto_tool_choice": "Auto tool choice",
                  "reasoning_parser": "Reasoning parser", "chat_template": "Chat template",
                  "max_images_per_prompt": "Images per request", "max_image_bytes":
                  "Largest image (bytes)", "max_image_pixels": "Largest image (pixels)",
                  "media_paths": "Image directories", "media_domains": "Image hosts"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["block_size"].choices = [("", "engine default"),
                                             *Deployment.BlockSize.choices]
        if self.instance.pk:
            # The name keys the deployment's log and KV directories.
            self.fields["name"].disabled = True
        # A template's leading and trailing whitespace is part of the prompts it renders.
        self.fields["chat_template"].strip = False
        for field in self.fields.values():
            # Positive integer fields add a generic ">= 0" that would hide the model's real
            # lower bound (e.g. a context length of at least 16).
            field.validators = [v for v in field.validators
                                if not (isinstance(v, MinValueValidator) and v.limit_value == 0)]

    def clean_chat_template(self) -> str:
        # Browsers send a text area's lines ending in CRLF; vLLM would put each \r into the
        # prompts, which the model's template never does.
        return self.cleaned_data["chat_template"].replace("\r\n", "\n")

    def clean_sampling_defaults(self) -> dict[str, Any]:
        # An emptied text area means "no overrides", not SQL NULL.
        return self.cleaned_data["sampling_defaults"] or {}

    def clean_media_paths(self) -> list[str]:
        return self.cleaned_data["media_paths"] or []

    def clean_media_domains(self) -> list[str]:
        return self.cleaned_data["media_domains"] or []


class PoolForm(forms.Form):
    variant = forms.ModelChoiceField(Variant.objects.select_related("base"))


class InstanceForm(forms.Form):
    """Blank values are proposed when the plan is saved: free ports and free devices."""

    node = forms.ModelChoiceField(Node.objects.all(), required=False, empty_label="local node")
    cpu_cores = forms.CharField(required=False, max_length=200, validators=[validate_core_list])
    gpu_indices = forms.CharField(required=False, max_length=200, validators=[validate_core_list])
    port = forms.IntegerField(required=False, validators=[validate_port])
    side_channel_port = forms.IntegerField(required=False, validators=[validate_port])
    share_devices = forms.BooleanField(required=False)

    def instance_input(self) -> InstanceInput:
        data = self.cleaned_data
        return InstanceInput(
            node=data["node"], cpu_cores=data["cpu_cores"] or None,
            gpu_indices=data["gpu_indices"] or None, port=data["port"],
            side_channel_port=data["side_channel_port"], share_devices=data["share_devices"],
        )


InstanceFormSet = forms.formset_factory(InstanceForm, extra=0, can_delete=True,
                                        max_num=MAX_INSTANCES, validate_max=True)


def _stored_instances(deployment: Deployment) -> dict[str, list[dict[str, Any]]]:
    return {role: [{"node": i.node, "cpu_cores": i.cpu_cores, "gpu_indices": i.gpu_indices,
                    "port": i.port, "side_channel_port": i.side_channel_port,
                    "share_devices": i.share_devices} for i in pool.instances]
            for role, pool in stored_pools(deployment).items()}


def _proposed_start() -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """A new plan starts with one prefill and one decode on free ports and cores here."""
    node = local_node()
    ledger = Ledger.for_node(node, exclude=None)
    instances = {role: [{"node": node, "cpu_cores": ledger.core(), "port": ledger.port(role),
                         "side_channel_port": ledger.side_channel_port()}]
                 for role in POOL_ROLES[Deployment.Mode.PD]}
    plan = {"router_port": ledger.router_port(), "engine_version": node.engine_version}
    return plan, instances


class PlanEditor:
    """The plan form with its pools and instance rows, validated and read as one."""

    def __init__(self, data: QueryDict | None = None, deployment: Deployment | None = None,
                 teams: QuerySet[Team] | None = None) -> None:
        """``teams``: those the plan may be put in (where the user is admin)."""
        self.deployment = deployment
        if deployment is not None:
            plan_initial, initial = {}, _stored_instances(deployment)
        elif data is None:
            plan_initial, initial = _proposed_start()
        else:
            plan_initial, initial = {}, {}
        variants = {w.role: w.variant_id for w in deployment.workers.all()} if deployment else {}
        if data is not None and teams is not None and len(teams) == 1 and not data.get("team"):
            # One team to choose from: the form may leave it out.
            data = data.copy()
            data["team"] = str(teams[0].pk)
        self.plan = PlanForm(data, instance=deployment, initial=plan_initial)
        if teams is not None:
            self.plan.fields["team"].queryset = teams
            if deployment is None and data is None and len(teams) == 1:
                self.plan.initial["team"] = teams[0].pk
        self.pools = {role: PoolForm(data, prefix=role, initial={"variant": variants.get(role)})
                      for role in ROLES}
        self.instances = {role: InstanceFormSet(data, prefix=f"{role}-instances",
                                                initial=initial.get(role, []))
                          for role in ROLES}

    def roles(self) -> tuple[str, ...]:
        mode = self.plan.data.get("mode") if self.plan.is_bound else None
        mode = mode or (self.deployment.mode if self.deployment else Deployment.Mode.PD)
        return POOL_ROLES.get(mode, POOL_ROLES[Deployment.Mode.PD])

    def sections(self) -> list[tuple[str, PoolForm, forms.BaseFormSet]]:
        return [(role, self.pools[role], self.instances[role]) for role in ROLES]

    def is_valid(self) -> bool:
        valid = self.plan.is_valid()
        for role in self.roles():
            valid = self.pools[role].is_valid() and valid
            valid = self.instances[role].is_valid() and valid
            if self.instances[role].is_valid() and not self._rows(role):
                self.pools[role].add_error(None, f"add at least one {role} instance")
                valid = False
        return valid

    def _rows(self, role: str) -> list[InstanceForm]:
        return [form for form in self.instances[role].forms
                if form.cleaned_data and not form.cleaned_data.get("DELETE")]

    def plan_input(self) -> PlanInput:
        fields = dict(self.plan.cleaned_data)
        if self.deployment is not None:
            fields.pop("name", None)
        pools = {role: PoolInput(variant=self.pools[role].cleaned_data["variant"],
                                 instances=[f.instance_input() for f in self._rows(role)])
                 for role in self.roles()}
        return PlanInput(fields=fields, pools=pools)

    def add_errors(self, exc: ValidationError) -> None:
        """Put errors from saving ("decode.instances.1.port", "name") on their fields."""
        for key, messages in exc.message_dict.items():
            role, _, rest = key.partition(".")
            if role in ROLES and rest.startswith("instances."):
                _, index, name = rest.split(".", 2)
                row = self._rows(role)[int(index)]
                row.add_error(name if name in row.fields else None, messages)
            elif role in ROLES:
                self.pools[role].add_error(None, messages)
            else:
                self.plan.add_error(key if key in self.plan.fields else None, messages)

    def error_list(self) -> list[str]:
        """Every error as "field: message", for the live check panel."""
        found = [f"{self.plan.fields[f].label if f in self.plan.fields else 'plan'}: {m}"
                 for f, ms in self.plan.errors.items() for m in ms]
        for role in self.roles():
            found += [f"{role} pool: {m}" for ms in self.pools[role].errors.values() for m in ms]
            found += [f"{role} pool: {m}" for m in self.instances[role].non_form_errors()]
            for index, errors in enumerate(self.instances[role].errors):
                found += [f"{role}-{index} {name.replace('_', ' ')}: {m}"
                          for name, ms in errors.items() for m in ms]
        return found
