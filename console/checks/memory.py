"""memory.fit: weights, KV cache and runtime of every worker fit its device, with headroom.

A multimodal variant's worker holds more: its vision encoder's weights (counted once, within
the weights: parameter_count includes them), the processor cache it is given
(--mm-processor-cache-gb, once in vLLM's API server and once in its engine core) and the encoder
cache (the vision encoder's outputs waiting for the language model: vLLM 0.32 budgets it at
max_num_batched_tokens embeddings of the text model's width).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from console.catalog.models import DTYPE_BYTES
from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView
from console.deployments.images import (
    PROCESSOR_CACHE_COPIES,
    encoder_cache_tokens,
    mm_limits,
    processor_cache_gb,
)
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import GIB, Node

# Measured: a vLLM CPU worker serving SmolLM2-135M with a 1 GiB KV cache held ~2.7 GB RSS,
# so ~1.5 GiB beyond weights and cache (Python, torch, compiled kernels, buffers).
CPU_RUNTIME_BYTES = int(1.5 * GIB)
# CUDA context, activations and CUDA graphs on the GPU: a rough allowance.
GPU_RUNTIME_BYTES = 1 * GIB
HEADROOM = 0.10  # of a node's memory, for the OS, the console and the router
GPU_MEMORY_UTILIZATION = 0.90  # vLLM's default share of a GPU it may take


def gib(size: float) -> str:
    return f"{size / GIB:.2f} GiB"


@dataclass(frozen=True)
class Estimate:
    worker: WorkerPlan
    weights: int
    weights_how: str
    kv_cache: int
    runtime: int
    # A multimodal worker's: in host memory, and beside its activations (0 for a text model).
    processor_cache: int = 0
    encoder_cache: int = 0
    encoder_how: str = ""

    @property
    def total(self) -> int:
        return (self.weights + self.kv_cache + self.runtime + self.processor_cache
                + self.encoder_cache)

    def arithmetic(self) -> str:
        images = ""
        if self.processor_cache:
            each = self.processor_cache / PROCESSOR_CACHE_COPIES / GIB
            images += (f" + {gib(self.processor_cache)} processor cache ({each:g} GiB "
                       f"--mm-processor-cache-gb x {PROCESSOR_CACHE_COPIES}: API server and "
                       "engine core)")
        if self.encoder_cache:
            images += f" + {gib(self.encoder_cache)} encoder cache ({self.encoder_how})"
        return (f"{self.worker.slot} {gib(self.weights)} weights ({self.weights_how}) + "
                f"{gib(self.kv_cache)} KV cache + {gib(self.runtime)} runtime{images} = "
                f"{gib(self.total)}")


def _compute_dtype(deployment: Deployment, worker: WorkerPlan) -> str:
    return worker.variant.dtype if deployment.dtype == Deployment.Dtype.AUTO else deployment.dtype


def estimate(deployment: Deployment, worker: WorkerPlan) -> Estimate:
    variant = worker.variant
    dtype = _compute_dtype(deployment, worker)
    if variant.parameter_count and not variant.is_quantized and dtype in DTYPE_BYTES:
        weights = variant.parameter_count * DTYPE_BYTES[dtype]
        how = f"{variant.parameter_count / 1e6:.1f}M params x {DTYPE_BYTES[dtype]} B {dtype}"
    else:
        weights = variant.weight_bytes
        how = f"{variant.quantization or variant.dtype} files on disk"
    if variant.encoder_parameter_count:
        # Already in parameter_count and in the files: named, not added.
        how += f", of which {variant.encoder_parameter_count / 1e6:.2f}M vision encoder params"
    gpus = len(worker.gpu_tuple()) or 1
    processor, encoder, encoder_how = _multimodal(deployment, worker, dtype)
    return Estimate(worker, weights // gpus, how + (f" / {gpus} GPUs" if gpus > 1 else ""),
                    deployment.kv_cache_gib * GIB,
                    GPU_RUNTIME_BYTES if worker.gpu_tuple() else CPU_RUNTIME_BYTES,
                    processor, encoder, encoder_how)


def _multimodal(deployment: Deployment, worker: WorkerPlan, dtype: str) -> tuple[int, int, str]:
    """(processor cache, encoder cache, how the encoder cache was sized) of a worker that takes
    images; zeros for a text model or a plan that allows none (vLLM then makes no encoder
    cache)."""
    if not sum(mm_limits(deployment, worker).values()):
        return 0, 0, ""
    variant = worker.variant
    tokens, source = encoder_cache_tokens(deployment)
    # The text model's width: its hidden size, for the attention layouts inspection accepts.
    width = (variant.num_attention_heads or 0) * (variant.head_dim or 0)
    size = DTYPE_BYTES.get(dtype, 2)
    how = (f"{tokens} tokens ({source}) x width {width} ({variant.num_attention_heads} heads x "
           f"{variant.head_dim}) x {size} B {dtype}")
    cache = round(processor_cache_gb(deployment)[0] * GIB) * PROCESSOR_CACHE_COPIES
    return cache, tokens * width * size, how


def kv_bytes_per_token(plan: PlanView, worker: WorkerPlan) -> tuple[int, str]:
    variant = worker.variant
    dtype = plan.kv_dtype(worker)
    size = DTYPE_BYTES.get(dtype, 2)
    per_token = 2 * variant.num_layers * variant.num_kv_heads * variant.head_dim * size
    how = (f"2 x {variant.num_layers} layers x {variant.num_kv_heads} KV heads x head dim "
           f"{variant.head_dim} x {size} B ({dtype}) = {per_token / 1024:.1f} KiB per token")
    return per_token, how


@check("memory.fit", "weights + KV cache for context x concurrency fit each device with headroom")
def memory_fit(plan: PlanView) -> Verdict:
    if plan.uninspected():
        return Verdict(summary="not estimated: a variant is not inspected (see model.path)",
                       skipped=True)
    findings: list[Finding] = []
    lines: list[str] = []
    for worker in plan.workers:
        finding, line = _kv_capacity(plan, worker)
        lines.append(line)
        if finding:
            findings.append(finding)
    own = [estimate(plan.deployment, w) for w in plan.workers]
    others = [estimate(w.deployment, w) for w in plan.neighbours]
    for node in {w.node_id: w.node for w in plan.workers}.values():
        finding, line = node_fit(node, [e for e in own if e.worker.node_id == node.pk],
                                  [e for e in others if e.worker.node_id == node.pk])
        lines.append(line)
        if finding:
            findings.append(finding)
    for worker, estimate_ in ((e.worker, e) for e in own if e.worker.gpu_tuple()):
        findings += _gpu_fit(worker, estimate_, lines)
    return Verdict(findings, "; ".join(lines))


def _kv_capacity(plan: PlanView, worker: WorkerPlan) -> tuple[Finding | None, str]:
    deployment = plan.deployment
    per_token, how = kv_bytes_per_token(plan, worker)
    cache = deployment.kv_cache_gib * GIB
    one = per_token * deployment.max_model_len
    wanted = one * deployment.concurrency
    fits = cache // one
    line = (f"{worker.slot} KV: {how}; {deployment.max_model_len} tokens x "
            f"{deployment.concurrency} requests = {gib(wanted)} of its {gib(cache)} KV cache")
    needed_gib = -(-wanted // GIB)
    if fits < 1:
        return error(
            f"{worker.slot}'s KV cache ({gib(cache)}) cannot hold one request at full context "
            f"({gib(one)}: {how} x {deployment.max_model_len} tokens): vLLM refuses to start",
            f"raise the KV cache size to at least {-(-one // GIB)} GiB "
            f"({needed_gib} GiB for {deployment.concurrency} requests), or lower the context "
            "length"), line
    if fits < deployment.concurrency:
        return warning(
            f"{worker.slot}'s KV cache holds {fits} request(s) at full context; the plan wants "
            f"{deployment.concurrency} ({line})",
            f"raise the KV cache size to {needed_gib} GiB, or lower the concurrency to {fits}"), line
    return None, line


def node_fit(node: Node, own: list[Estimate],
              others: list[Estimate]) -> tuple[Finding | None, str]:
    usable = int(node.memory_bytes * (1 - HEADROOM))
    # GPU workers keep weights and KV cache on the GPU; their host side is the runtime alone.
    # The processor cache is host memory either way.
    host = [e if not e.worker.gpu_tuple() else
            Estimate(e.worker, 0, "on GPU", 0, CPU_RUNTIME_BYTES, e.processor_cache)
            for e in own + others]
    total = sum(e.total for e in host)
    parts = [e.arithmetic() for e in host[:len(own)]]
    if others:
        parts.append(f"other running deployments {gib(sum(e.total for e in host[len(own):]))}")
    line = (f"node {node.name} RAM: {'; '.join(parts)}; total {gib(total)} of {gib(usable)} "
            f"usable ({gib(node.memory_bytes)} - {HEADROOM:.0%} headroom)")
    if total <= usable:
        return None, line
    return error(f"node {node.name} lacks memory: {line}",
                 "lower the KV cache size or the context length, use a smaller variant, or move "
                 "workers to another node"), line


def _gpu_fit(worker: WorkerPlan, estimate_: Estimate, lines: list[str]) -> list[Finding]:
    findings = []
    gpus = {g.index: g for g in worker.node.gpus.all()}
    for index in worker.gpu_tuple():
        gpu = gpus.get(index)
        if gpu is None:
            continue  # device.conflict reports GPUs the node lacks
        usable = int(gpu.memory_bytes * GPU_MEMORY_UTILIZATION)
        on_gpu = replace(estimate_, processor_cache=0)  # in host memory (node_fit counts it)
        line = (f"{worker.node.name} GPU {index} ({gpu.name}): {on_gpu.arithmetic()} of "
                f"{gib(usable)} ({GPU_MEMORY_UTILIZATION:.0%} of {gib(gpu.memory_bytes)})")
        lines.append(line)
        if on_gpu.total > usable:
            findings.append(error(f"{worker.slot} does not fit GPU {index}: {line}",
                                  "lower the KV cache size, use a quantized variant, or spread "
                                  "the worker over more GPUs"))
    return findings
