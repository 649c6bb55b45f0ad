"""The load the advice page is for: a recorded window or a synthetic profile typed in."""

from __future__ import annotations

from typing import Any

from django import forms

from console.advisor.load_sources import WINDOWS, Load, recorded, synthetic
from console.deployments.models import Deployment

MAX_LENGTH_SAMPLES = 1000


def token_list(text: str, field: str) -> list[int]:
    """Whole numbers above 0 separated by commas: fixed (one) or samples to draw from."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise forms.ValidationError({field: "whole numbers separated by commas"}) from None
    if not values or min(values) < 1 or len(values) > MAX_LENGTH_SAMPLES:
        raise forms.ValidationError({field: f"1 to {MAX_LENGTH_SAMPLES} whole numbers above 0"})
    return values


class LoadForm(forms.Form):
    window = forms.ChoiceField(choices=[(w, f"last {w}") for w in WINDOWS], required=False)
    rate_per_s = forms.FloatField(required=False, min_value=0.001, max_value=10_000,
                                  label="synthetic: requests per second")
    prompt_tokens = forms.CharField(required=False, max_length=8000,
                                    help_text="a length, or lengths to draw from (comma-separated)")
    output_tokens = forms.CharField(required=False, max_length=8000)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("rate_per_s") is None:
            for field in ("prompt_tokens", "output_tokens"):
                if data.get(field):
                    raise forms.ValidationError({"rate_per_s": "a synthetic load needs its rate"})
            return data
        for field in ("prompt_tokens", "output_tokens"):
            if not data.get(field):
                raise forms.ValidationError({field: "a synthetic load needs its lengths"})
            data[field] = token_list(data[field], field)
        return data

    def load(self, deployment: Deployment) -> Load:
        """The cleaned load; raises load_sources.LoadUnavailable when a window holds too little."""
        data = self.cleaned_data
        if data.get("rate_per_s") is not None:
            return synthetic(data["rate_per_s"], data["prompt_tokens"], data["output_tokens"])
        return recorded(deployment, data.get("window") or "hour")
