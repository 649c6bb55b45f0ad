"""Deployment plans: what runs where, and the state the operator wants it in."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from console.validators import validate_core_list, validate_port
from inference.kv_channels import CHANNEL_NAMES


class Deployment(models.Model):
    class DesiredState(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    class Mode(models.TextChoices):
        PD = "pd", "prefill/decode disaggregated"
        COLOCATED = "colocated", "colocated (no PD)"

    name = models.SlugField(max_length=100, unique=True)
    base_model = models.ForeignKey("catalog.BaseModel", on_delete=models.PROTECT,
                                   related_name="deployments")
    served_model_name = models.CharField(max_length=100)
    mode = models.CharField(max_length=20, choices=Mode.choices, default=Mode.PD)
    max_model_len = models.PositiveIntegerField(
        validators=[MinValueValidator(16), MaxValueValidator(1_048_576)], default=2048
    )
    kv_channel = models.CharField(
        max_length=30, choices=[(n, n) for n in CHANNEL_NAMES], default="shared-storage"
    )
    kv_cache_gib = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1024)]
    )
    dtype = models.CharField(max_length=20, default="bfloat16",
                             help_text="compute dtype of every worker (vLLM --dtype)")
    sampling_defaults = models.JSONField(
        default=dict, blank=True,
        help_text="default sampling parameters for every worker, e.g. {\"temperature\": 0}",
    )
    router_host = models.GenericIPAddressField(default="127.0.0.1")
    router_port = models.PositiveIntegerField(default=8080, validators=[validate_port])
    desired_state = models.CharField(max_length=10, choices=DesiredState.choices,
                                     default=DesiredState.STOPPED)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def router_url(self) -> str:
        return f"http://{self.router_host}:{self.router_port}"


class WorkerPlan(models.Model):
    """One planned vLLM worker of a deployment."""

    class Role(models.TextChoices):
        PREFILL = "prefill"
        DECODE = "decode"
        COLOCATED = "colocated"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="workers")
    role = models.CharField(max_length=20, choices=Role.choices)
    index = models.PositiveSmallIntegerField(default=0)
    variant = models.ForeignKey("catalog.Variant", on_delete=models.PROTECT, related_name="workers")
    host = models.GenericIPAddressField(default="127.0.0.1")
    port = models.PositiveIntegerField(validators=[validate_port])
    side_channel_port = models.PositiveIntegerField(null=True, blank=True,
                                                    validators=[validate_port])
    cpu_cores = models.CharField(max_length=200, blank=True, validators=[validate_core_list],
                                 help_text="comma-separated CPU cores, e.g. '0' or '2,3'")
    gpu_indices = models.CharField(max_length=200, blank=True, validators=[validate_core_list])

    class Meta:
        ordering = ["deployment", "role", "index"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "role", "index"],
                                    name="worker_unique_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment.name}/{self.slot}"

    @property
    def slot(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def core_tuple(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.cpu_cores.split(",") if c.strip())

    def gpu_tuple(self) -> tuple[int, ...]:
        return tuple(int(c) for c in self.gpu_indices.split(",") if c.strip())
