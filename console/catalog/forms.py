from __future__ import annotations

from django import forms

from console.catalog.models import BaseModel, Variant
from inference.quantization.options import DEFAULT_GROUP_SIZE, METHODS, SCHEMES


class BaseModelForm(forms.ModelForm):
    class Meta:
        model = BaseModel
        fields = ["name", "description"]


class RegisterForm(forms.ModelForm):
    """A directory to register; everything else about the variant is read from it."""

    class Meta:
        model = Variant
        fields = ["base", "name", "path"]
        labels = {"base": "Base model", "name": "Variant name", "path": "Directory"}
        help_texts = {"path": "absolute path of a Hugging Face model directory (config.json, "
                              "safetensors, tokenizer)"}


class QuantizeForm(forms.Form):
    """Quantize a base model's unquantized variant; empty fields take the builder's defaults."""

    scheme = forms.ChoiceField(choices=[(s, s) for s in SCHEMES])
    method = forms.ChoiceField(choices=[("", "default (gptq; fp8: rtn)")] + [(m, m) for m in METHODS],
                               required=False,
                               help_text="gptq calibrates on the shipped text; rtn is seconds")
    group_size = forms.IntegerField(required=False, label="Group size",
                                    help_text=f"w4a16 only (default {DEFAULT_GROUP_SIZE})")
    smoothing_strength = forms.FloatField(required=False, label="SmoothQuant strength",
                                          help_text="w8a8-int8 with gptq (default 0.8, 0 = off)")
    name = forms.SlugField(required=False, label="Variant name", help_text="default <scheme>-<method>")
