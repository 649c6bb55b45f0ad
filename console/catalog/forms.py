from __future__ import annotations

from django import forms

from console.catalog.models import BaseModel, Variant


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
