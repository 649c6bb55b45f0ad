"""The revision page's forms: a draft (only what is filled in changes) and a rollout's start."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.rollouts.models import Rollout
from console.rollouts.services import START_TIMEOUT_RANGE

TEXT_FIELDS = ("dtype", "kv_channel", "kv_cache_dtype", "kv_load_failure", "engine_version")
JSON_FIELDS = ("sampling_defaults", "extra_engine_args")
ROLES = ("prefill", "decode", "colocated")


class DraftForm(forms.Form):
    """A field left blank keeps the live revision's value."""

    mode = forms.ChoiceField(choices=[("", "as live"), *Deployment.Mode.choices], required=False)
    dtype = forms.CharField(required=False, max_length=20)
    kv_channel = forms.CharField(required=False, max_length=20)
    block_size = forms.IntegerField(required=False, min_value=1)
    kv_cache_dtype = forms.CharField(required=False, max_length=20)
    kv_cache_gib = forms.FloatField(required=False, min_value=0)
    kv_load_failure = forms.CharField(required=False, max_length=20)
    engine_version = forms.CharField(required=False, max_length=40)
    max_images_per_prompt = forms.IntegerField(required=False, min_value=0,
                                               label="Images per request")
    sampling_defaults = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                        help_text="JSON object")
    extra_engine_args = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                        help_text="JSON")
    prefill = forms.ModelChoiceField(Variant.objects.select_related("base"), required=False)
    decode = forms.ModelChoiceField(Variant.objects.select_related("base"), required=False)
    colocated = forms.ModelChoiceField(Variant.objects.select_related("base"), required=False)
    note = forms.CharField(required=False, max_length=300)

    def _json(self, name: str) -> Any:
        raw = self.cleaned_data.get(name, "")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc.msg}") from exc

    def clean_sampling_defaults(self) -> Any:
        return self._json("sampling_defaults")

    def clean_extra_engine_args(self) -> Any:
        return self._json("extra_engine_args")

    def draft_input(self) -> tuple[dict[str, Any], dict[str, Variant], str]:
        data = self.cleaned_data
        fields = {name: data[name] for name in ("mode", *TEXT_FIELDS) if data.get(name)}
        fields.update({name: data[name] for name in ("block_size", "kv_cache_gib",
                                                     "max_images_per_prompt", *JSON_FIELDS)
                       if data.get(name) is not None})
        variants = {role: data[role] for role in ROLES if data.get(role) is not None}
        return fields, variants, data.get("note", "")


class StartForm(forms.Form):
    strategy = forms.ChoiceField(choices=Rollout.Strategy.choices)
    steps = forms.CharField(required=False, help_text='JSON, e.g. [{"weight": 10, "hold_s": 60}, '
                            '{"weight": 100}]; blank: the default')
    start_timeout_s = forms.IntegerField(
        required=False, min_value=START_TIMEOUT_RANGE[0], max_value=START_TIMEOUT_RANGE[1],
        label="Start deadline (s)",
        help_text="how long a green worker may make no progress; blank: 3 x the slowest "
                  "recorded start (300-3600 s)")
    verify_green = forms.BooleanField(
        required=False, label="Verify green",
        help_text="drain blue only after a verification report of green alone passed")

    def clean_steps(self) -> Any:
        raw = self.cleaned_data.get("steps", "")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc.msg}") from exc
