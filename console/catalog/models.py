"""Models and their variants: what a worker loads.

A variant's facts are read from its directory when it is registered (``inspection.py``); the
sha256 of its weight files is computed afterwards by a background job (``tasks.py``).
"""

from __future__ import annotations

from django.db import models

from console.validators import validate_model_path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


class BaseModel(models.Model):
    """A base model, e.g. SmolLM2-135M-Instruct; its variants are checkpoints of it."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Variant(models.Model):
    """One checkpoint of a base model on disk (bf16, or a quantization of it)."""

    class Format(models.TextChoices):
        SAFETENSORS = "safetensors"

    class HashState(models.TextChoices):
        PENDING = "pending"  # nothing to hash yet: the directory has not been inspected
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    base = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="variants")
    name = models.SlugField(max_length=100)
    path = models.CharField(max_length=1000, unique=True, validators=[validate_model_path])
    format = models.CharField(max_length=20, choices=Format.choices, default=Format.SAFETENSORS)
    dtype = models.CharField(max_length=40, default="bfloat16", help_text="dtype of the weights")
    quantization = models.CharField(max_length=60, blank=True,
                                    help_text="quantization method and scheme; empty when none")
    architecture = models.CharField(max_length=100, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    size_bytes = models.BigIntegerField(default=0, help_text="all files of the directory")

    # Attention and KV geometry, from config.json. vLLM splits the heads over a worker's GPUs
    # (tensor parallel), so they bound the GPU counts a worker may have.
    num_attention_heads = models.PositiveIntegerField(null=True, blank=True)
    num_layers = models.PositiveIntegerField(null=True, blank=True)
    num_kv_heads = models.PositiveIntegerField(null=True, blank=True)
    head_dim = models.PositiveIntegerField(null=True, blank=True)
    kv_dtype = models.CharField(max_length=20, blank=True)
    kv_dtype_from_checkpoint = models.BooleanField(
        default=False, help_text="the quantization scheme fixes the KV cache dtype")
    max_positions = models.PositiveIntegerField(null=True, blank=True)

    tokenizer_sha256 = models.CharField(max_length=64, blank=True)
    tokenizer_files = models.JSONField(default=dict, blank=True, help_text="file name -> sha256")
    chat_template_sha256 = models.CharField(max_length=64, blank=True,
                                            help_text="empty when the model ships no template")
    generation_config = models.JSONField(default=dict, blank=True)
    # What a request may hold besides text, and what turns it into tokens: prefill and decode
    # must process an image the same way (console/checks/multimodal.py).
    modalities = models.JSONField(default=list, blank=True,
                                  help_text='inputs the model takes, e.g. ["text", "image"]')
    processor_sha256 = models.CharField(
        max_length=64, blank=True, help_text="the processor configuration files' combined sha256; "
                                             "empty when the directory holds none")
    processor_files = models.JSONField(default=dict, blank=True, help_text="file name -> sha256")
    encoder_parameter_count = models.BigIntegerField(
        default=0, help_text="parameters of the vision tower and its projector (part of "
                             "parameter_count); 0 for a text model")
    weight_files = models.JSONField(default=list, blank=True,
                                    help_text='[{"name", "size", "mtime_ns"}] when inspected')
    inspected_at = models.DateTimeField(null=True, blank=True)
    inspection_error = models.CharField(max_length=500, blank=True)

    weights_sha256 = models.CharField(max_length=64, blank=True)
    file_hashes = models.JSONField(default=dict, blank=True, help_text="weight file -> sha256")
    hash_state = models.CharField(max_length=10, choices=HashState.choices,
                                  default=HashState.PENDING)
    # Each hashing request gets a new id; a job whose id is no longer current writes nothing.
    hash_job = models.CharField(max_length=36, blank=True)
    hash_bytes_done = models.BigIntegerField(default=0)
    hash_bytes_total = models.BigIntegerField(default=0)
    hash_error = models.CharField(max_length=500, blank=True)
    hashed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["base", "name"]
        constraints = [models.UniqueConstraint(fields=["base", "name"], name="variant_unique_name")]

    def __str__(self) -> str:
        return f"{self.base.name}/{self.name}"

    @property
    def inspected(self) -> bool:
        return self.inspected_at is not None and not self.inspection_error

    @property
    def is_multimodal(self) -> bool:
        return any(modality != "text" for modality in self.modalities)

    @property
    def is_quantized(self) -> bool:
        return bool(self.quantization)

    @property
    def weight_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.weight_files)

    @property
    def hash_percent(self) -> int:
        if self.hash_state == self.HashState.DONE:
            return 100
        if not self.hash_bytes_total:
            return 0
        return min(100, self.hash_bytes_done * 100 // self.hash_bytes_total)

    @property
    def hash_status(self) -> str:
        """One phrase for pages and messages: 'sha256 ab12cd34…', 'hashing 40%', ..."""
        if self.hash_state == self.HashState.DONE:
            return f"sha256 {self.weights_sha256[:12]}…"
        if self.hash_state == self.HashState.RUNNING:
            return f"hashing {self.hash_percent}%"
        if self.hash_state == self.HashState.FAILED:
            return f"hashing failed: {self.hash_error}"
        return f"hashing {self.hash_state}"


class QuantizationJob(models.Model):
    """Building a quantized variant of a base model's unquantized variant, in the background.

    The Celery task runs ``python -m inference.quantize`` in the quantization environment and
    copies its progress here; on success the new directory is registered as a Variant.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    ACTIVE_STATES = (State.QUEUED, State.RUNNING)

    base = models.ForeignKey(BaseModel, on_delete=models.CASCADE, related_name="quantization_jobs")
    source = models.ForeignKey(Variant, on_delete=models.SET_NULL, null=True,
                               related_name="quantization_jobs",
                               help_text="the unquantized variant that is quantized")
    name = models.SlugField(max_length=100, help_text="name of the variant to create")
    path = models.CharField(max_length=1000, help_text="directory the variant is written to")
    scheme = models.CharField(max_length=20)
    method = models.CharField(max_length=10)
    group_size = models.PositiveIntegerField(null=True, blank=True)
    smoothing_strength = models.FloatField(null=True, blank=True)
    samples = models.PositiveIntegerField(default=40)

    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    percent = models.FloatField(default=0)
    stage = models.CharField(max_length=20, blank=True)
    detail = models.CharField(max_length=200, blank=True)
    log_tail = models.TextField(blank=True, help_text="the builder's last log lines")
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    # The builder's process group, and the task's last sign of life: a running job whose
    # heartbeat stops was orphaned by a killed worker.
    pid = models.PositiveIntegerField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    build_seconds = models.FloatField(null=True, blank=True)
    variant = models.ForeignKey(Variant, on_delete=models.SET_NULL, null=True, blank=True,
                                related_name="+", help_text="the variant the job registered")

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            # One build at a time per variant name: a second would race for the same directory.
            models.UniqueConstraint(fields=["base", "name"],
                                    condition=models.Q(state__in=["queued", "running"]),
                                    name="quantization_job_one_active_per_name"),
        ]

    def __str__(self) -> str:
        return f"{self.base.name}/{self.name} ({self.state})"

    @property
    def active(self) -> bool:
        return self.state in self.ACTIVE_STATES

    @property
    def options_label(self) -> str:
        parts = [self.scheme, self.method]
        if self.group_size:
            parts.append(f"group size {self.group_size}")
        if self.smoothing_strength:
            parts.append(f"SmoothQuant {self.smoothing_strength:g}")
        return ", ".join(parts)


class VariantCopy(models.Model):
    """A variant's files as a node agent found them on its node: the model.path check's
    answer for nodes other than the console's own (console/catalog/copies.py)."""

    class State(models.TextChoices):
        PENDING = "pending"  # asked of the node's agent
        HASHING = "hashing"
        VERIFIED = "verified"  # every weight file there, with the variant's sha256
        DIFFERENT = "different"  # there, but not the same files
        MISSING = "missing"  # no such directory, or a weight file absent
        FAILED = "failed"  # could not be read

    variant = models.ForeignKey(Variant, on_delete=models.CASCADE, related_name="copies")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="variant_copies")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    sha256 = models.CharField(max_length=64, blank=True)
    detail = models.CharField(max_length=500, blank=True)
    bytes_done = models.BigIntegerField(default=0)
    # The variant's inspection this copy was compared with: a new inspection asks again.
    inspected_at = models.DateTimeField(null=True, blank=True)
    requested_at = models.DateTimeField()
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["variant", "node"],
                                               name="variant_copy_unique_node")]

    def __str__(self) -> str:
        return f"{self.variant} on {self.node}: {self.state}"
