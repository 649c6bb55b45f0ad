"""Models and their variants: what a worker loads."""

from __future__ import annotations

from django.db import models

from console.validators import validate_model_path


class BaseModel(models.Model):
    """A base model, e.g. SmolLM2-135M-Instruct; its variants are checkpoints of it."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)

    def __str__(self) -> str:
        return self.name


class Variant(models.Model):
    """One checkpoint of a base model on disk (bf16, or a quantization of it)."""

    class Format(models.TextChoices):
        SAFETENSORS = "safetensors"
        GGUF = "gguf"

    base = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="variants")
    name = models.SlugField(max_length=100)
    path = models.CharField(max_length=1000, validators=[validate_model_path])
    format = models.CharField(max_length=20, choices=Format.choices, default=Format.SAFETENSORS)
    dtype = models.CharField(max_length=40, default="bfloat16")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["base", "name"], name="variant_unique_name")]

    def __str__(self) -> str:
        return f"{self.base.name}/{self.name}"
