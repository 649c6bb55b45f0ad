"""Deployment plans: what runs where, and the state the operator wants it in."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from console.accounts.roles import default_team_id
from console.deployments.engine_args import validate_engine_args
from console.fleet.services import local_node_id
from console.validators import (
    validate_core_list,
    validate_directory_list,
    validate_host_name_list,
    validate_port,
)
from inference.kv_channels import CHANNEL_NAMES

MAX_CONTEXT = 1_048_576
MIB = 1024 * 1024
# Bounds of a plan's image limits: what a request may carry through the router to the workers.
MAX_IMAGES_PER_PROMPT = 64
MAX_IMAGE_BYTES = 64 * MIB
MAX_IMAGE_PIXELS = 16384 * 16384
# Words the console's own URLs use after /deployments/.
RESERVED_NAMES = frozenset({"new"})


# The generation-config keys vLLM takes as sampling defaults, with the values each accepts.
SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0), "top_p": (1e-9, 1.0), "top_k": (-1, 1_000_000),
    "min_p": (0.0, 1.0), "repetition_penalty": (1e-9, 100.0), "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0), "max_new_tokens": (1, MAX_CONTEXT),
}
INTEGER_SAMPLING_KEYS = frozenset({"top_k", "max_new_tokens"})

validate_engine_version = RegexValidator(
    r"^[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][A-Za-z0-9.]+)?$", "a vLLM version such as 0.32.0")


# A parser name as vLLM registers them (hermes, llama3_json, granite-20b-fc); whether the
# node's vLLM has it is the tools.parsers check's question, since reading that takes the engine.
validate_parser_name = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                      "a vLLM parser name such as hermes or llama3_json")
# Chat templates of real models run to a few KiB (Llama 3.1's is ~5 KiB).
MAX_CHAT_TEMPLATE = 65_536


def validate_deployment_name(value: str) -> None:
    if value in RESERVED_NAMES:
        raise ValidationError(f"{value!r} is reserved; choose another name")


def validate_sampling_defaults(value: object) -> None:
    if not isinstance(value, dict):
        raise ValidationError('expected a JSON object such as {"temperature": 0}')
    for key, number in value.items():
        if key not in SAMPLING_RANGES:
            raise ValidationError(f"unknown key {key!r}; vLLM takes "
                                  f"{', '.join(sorted(SAMPLING_RANGES))}")
        low, high = SAMPLING_RANGES[key]
        integer = key in INTEGER_SAMPLING_KEYS
        if isinstance(number, bool) or not isinstance(number, int if integer else int | float):
            raise ValidationError(f"{key}: expected {'an integer' if integer else 'a number'}, "
                                  f"got {number!r}")
        if not low <= number <= high:
            raise ValidationError(f"{key}: {number} is outside {low:g}..{high:g}")



def verify_after_start_default() -> bool:
    """The console's default for new plans (PDSERVE_VERIFY_AFTER_START), read when a plan is
    made rather than frozen into the migration."""
    return settings.PDSERVE_VERIFY_AFTER_START


class Deployment(models.Model):
    class DesiredState(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    class Mode(models.TextChoices):
        PD = "pd", "prefill/decode disaggregated"
        COLOCATED = "colocated", "colocated (no PD)"

    class Dtype(models.TextChoices):
        AUTO = "auto", "auto (the weights' dtype)"
        BFLOAT16 = "bfloat16"
        FLOAT16 = "float16"
        FLOAT32 = "float32"

    class KVCacheDtype(models.TextChoices):
        AUTO = "auto", "auto (the compute dtype, or the checkpoint's KV scheme)"
        BFLOAT16 = "bfloat16"
        FLOAT16 = "float16"
        FP8 = "fp8"
        FP8_E4M3 = "fp8_e4m3"
        FP8_E5M2 = "fp8_e5m2"

    class BlockSize(models.IntegerChoices):
        B16 = 16
        B32 = 32
        B64 = 64
        B128 = 128
        B256 = 256

    class KVLoadFailure(models.TextChoices):
        # vLLM's kv_load_failure_policy on decode workers.
        FAIL = "fail", "fail the request (the router answers 502 kv_handoff_failed)"
        RECOMPUTE = "recompute", "recompute the prompt on decode"

    class RoutingPolicy(models.TextChoices):
        # inference/router/policies/: how the router picks a worker within one role's pool.
        LEAST_OUTSTANDING = "least_outstanding", "least outstanding (fewest requests in flight)"
        ROUND_ROBIN = "round_robin", "round robin"
        PREFIX_AWARE = "prefix_aware", "prefix aware (same prompt prefix, same worker; bounded by load)"

    class PDPolicy(models.TextChoices):
        # inference/router/adaptive.py: where each prompt is prefilled.
        ADAPTIVE = "pd_adaptive", "adaptive (per request, from measured prefill speed and load)"
        REMOTE = "remote", "always on a prefill worker (beyond one KV block)"

    class GateMode(models.TextChoices):
        AUTO = "auto", "auto (on when prefill and decode use different or quantized variants)"
        ON = "on", "on"
        OFF = "off", "off"

    class GateAction(models.TextChoices):
        BLOCK = "block", "block traffic (the router is not started)"
        WARN = "warn", "warn (traffic flows, the page warns)"

    name = models.SlugField(max_length=100, unique=True, validators=[validate_deployment_name])
    team = models.ForeignKey("accounts.Team", on_delete=models.PROTECT, related_name="deployments",
                             default=default_team_id,
                             help_text="the team that owns the deployment, its keys and rollouts")
    base_model = models.ForeignKey("catalog.BaseModel", on_delete=models.PROTECT,
                                   related_name="deployments")
    served_model_name = models.CharField(max_length=100)
    mode = models.CharField(max_length=20, choices=Mode.choices, default=Mode.PD)
    max_model_len = models.PositiveIntegerField(
        validators=[MinValueValidator(16), MaxValueValidator(MAX_CONTEXT)], default=2048,
        help_text="context length (vLLM --max-model-len) of every worker and the router",
    )
    longest_request = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CONTEXT)], default=2048,
        help_text="prompt plus completion tokens of the longest request you expect",
    )
    concurrency = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(4096)], default=8,
        help_text="requests at full context length each worker's KV cache should hold at once",
    )
    kv_channel = models.CharField(
        max_length=30, choices=[(n, n) for n in CHANNEL_NAMES], default="shared-storage"
    )
    kv_cache_gib = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(1024)],
        help_text="KV cache size of each worker in GiB",
    )
    block_size = models.PositiveSmallIntegerField(
        null=True, blank=True, choices=BlockSize.choices,
        help_text="KV cache block size in tokens; empty: the engine's default for the device",
    )
    kv_load_failure = models.CharField(
        max_length=20, choices=KVLoadFailure.choices, default=KVLoadFailure.FAIL,
        help_text="what decode does when it cannot load the KV cache prefill announced")
    kv_cache_dtype = models.CharField(max_length=20, choices=KVCacheDtype.choices,
                                      default=KVCacheDtype.AUTO)
    dtype = models.CharField(max_length=20, choices=Dtype.choices, default=Dtype.BFLOAT16,
                             help_text="compute dtype of every worker (vLLM --dtype)")
    engine_version = models.CharField(
        max_length=40, blank=True, validators=[validate_engine_version],
        help_text="vLLM version every worker's node must run, e.g. 0.32.0; empty: any, if equal",
    )
    sampling_defaults = models.JSONField(
        default=dict, blank=True, validators=[validate_sampling_defaults],
        help_text="default sampling parameters for every worker, e.g. {\"temperature\": 0}",
    )
    extra_engine_args = models.JSONField(
        default=list, blank=True, validators=[validate_engine_args],
        help_text='further vllm serve arguments for every worker, e.g. ["--max-num-seqs", "4"]')
    # Tool calling and templates: passed to every worker (and the template to the router too,
    # which renders chat prompts itself for length checks and the PD hand-off).
    tool_call_parser = models.CharField(
        max_length=60, blank=True, validators=[validate_parser_name],
        help_text="vLLM tool-call parser (--tool-call-parser), e.g. hermes, llama3_json, "
                  "pythonic; empty: none")
    enable_auto_tool_choice = models.BooleanField(
        default=False,
        help_text='let the model decide when to call tools (tool_choice "auto"); needs a '
                  "tool-call parser")
    chat_template = models.TextField(
        blank=True, max_length=MAX_CHAT_TEMPLATE,
        help_text="Jinja chat template for every worker and the router; empty: the model's own")
    reasoning_parser = models.CharField(
        max_length=60, blank=True, validators=[validate_parser_name],
        help_text="vLLM reasoning parser (--reasoning-parser), e.g. deepseek_r1; empty: none")
    # Images (multimodal variants): the router enforces every limit before any worker sees the
    # request; the workers get the count too (vLLM --limit-mm-per-prompt). They reach command
    # lines only as these validated values (console/control/worker_specs.py).
    max_images_per_prompt = models.PositiveSmallIntegerField(
        default=1, validators=[MaxValueValidator(MAX_IMAGES_PER_PROMPT)],
        help_text="images one request may carry (0: none); a text-only model takes none")
    max_image_bytes = models.PositiveIntegerField(
        default=2 * MIB, validators=[MinValueValidator(1), MaxValueValidator(MAX_IMAGE_BYTES)],
        help_text="largest image the router accepts, in bytes (decoded)")
    max_image_pixels = models.PositiveIntegerField(
        default=4096 * 4096, validators=[MinValueValidator(1), MaxValueValidator(MAX_IMAGE_PIXELS)],
        help_text="largest image the router accepts, in pixels (width x height)")
    media_paths = models.JSONField(
        default=list, blank=True, validators=[validate_directory_list],
        help_text='absolute directories a request may name image files in (file:// URLs), '
                  'e.g. ["/srv/images"]; empty: none')
    media_domains = models.JSONField(
        default=list, blank=True, validators=[validate_host_name_list],
        help_text='host names the router may fetch image URLs from, e.g. '
                  '["images.example.com"]; empty: none (data: URLs only)')
    verify_after_start = models.BooleanField(
        default=verify_after_start_default,
        help_text="run a verification report once every start and every rollout promotion is "
                  "ready (its connectivity, function, performance, stress, logs and resources)")
    degraded_mode = models.BooleanField(
        default=True,
        help_text="when no prefill worker is ready the router prefills on decode, and when no "
                  "decode worker is ready prefill runs whole requests; off: answer 503")
    router_host = models.GenericIPAddressField(default="127.0.0.1")
    router_port = models.PositiveIntegerField(default=8080, validators=[validate_port])
    prefill_policy = models.CharField(
        max_length=30, choices=RoutingPolicy.choices, default=RoutingPolicy.LEAST_OUTSTANDING,
        help_text="how the router picks a prefill worker")
    decode_policy = models.CharField(
        max_length=30, choices=RoutingPolicy.choices, default=RoutingPolicy.LEAST_OUTSTANDING,
        help_text="how the router picks a decode worker (a full worker in colocated mode)")
    pd_policy = models.CharField(
        max_length=30, choices=PDPolicy.choices, default=PDPolicy.ADAPTIVE,
        help_text="where each prompt is prefilled")
    stall_budget_ms = models.PositiveIntegerField(
        default=250, validators=[MinValueValidator(1), MaxValueValidator(60_000)],
        help_text="adaptive: the longest a decode worker's streams may pause for a prompt it "
                  "prefills itself")
    # The output gate (console/quality): after a start the workers' answers are compared with
    # the base model's before the router is started.
    gate_mode = models.CharField(
        max_length=10, choices=GateMode.choices, default=GateMode.AUTO,
        help_text="whether the output gate runs after a start")
    gate_prompts = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(16)],
        help_text="reference prompts the gate runs (1-16)")
    gate_min_agreement = models.FloatField(
        default=0.9, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="lowest share of answer tokens where each worker's top-1 token is the "
                  "reference's (0-1)")
    gate_max_mean_delta = models.FloatField(
        default=0.5, validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="highest mean |Δ logprob| (nats) of the reference's tokens per worker")
    gate_action = models.CharField(
        max_length=10, choices=GateAction.choices, default=GateAction.BLOCK,
        help_text="what a failing gate does")
    # Service-level objectives: the ready-made latency alerts fire above them.
    ttft_slo_ms = models.PositiveIntegerField(
        default=2000, validators=[MinValueValidator(1), MaxValueValidator(600_000)],
        help_text="time to first token, p95, that clients are promised (ms)")
    tpot_slo_ms = models.PositiveIntegerField(
        default=200, validators=[MinValueValidator(1), MaxValueValidator(60_000)],
        help_text="time per output token, p95, that clients are promised (ms)")
    desired_state = models.CharField(max_length=10, choices=DesiredState.choices,
                                     default=DesiredState.STOPPED)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValidationError({"enable_auto_tool_choice": (
                "needs a tool-call parser: vLLM cannot read tool calls out of the model's text "
                "without one; set tool_call_parser (e.g. hermes)")})

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
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="workers",
                             default=local_node_id)
    host = models.GenericIPAddressField(default="127.0.0.1")
    port = models.PositiveIntegerField(validators=[validate_port])
    side_channel_port = models.PositiveIntegerField(null=True, blank=True,
                                                    validators=[validate_port])
    cpu_cores = models.CharField(max_length=200, blank=True, validators=[validate_core_list],
                                 help_text="comma-separated CPU cores, e.g. '0' or '2,3'")
    gpu_indices = models.CharField(max_length=200, blank=True, validators=[validate_core_list])
    share_devices = models.BooleanField(
        default=False,
        help_text="declared sharing: may share cores or GPUs with workers that declare it too",
    )

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
