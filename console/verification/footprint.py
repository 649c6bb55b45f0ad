"""Resources: each worker's memory against its node's, its GPU memory against its GPUs' (on
CUDA), at idle and under load, and KV cache usage; read from the metrics collector's 1 s
samples (console/live/collector.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from console.live.models import MetricSample
from console.verification.subject import Subject
from console.verification.verdicts import FAIL, PASS, WARN, Section

GIB = 1 << 30
# Share of a node's memory its workers may hold; near the limit at idle means the context
# length, the KV cache size or the model's loading needs a change.
WARN_SHARE, FAIL_SHARE = 0.75, 0.90
KV_WARN = 0.95
# vLLM takes --gpu-memory-utilization (0.9 by default) of each GPU at start for weights,
# activations and the KV cache, so about 90 % at idle is a healthy worker; past these shares the
# GPU is near out of memory (another process on it, or a utilization set too high).
GPU_WARN_SHARE, GPU_FAIL_SHARE = 0.95, 0.99

Sample = dict[str, dict[str, Any]]


def samples_since(deployment_id: int, since: datetime) -> list[Sample]:
    """The deployment's 1 s samples from ``since`` on, oldest first: {slot: numbers}."""
    rows = MetricSample.objects.filter(
        deployment_id=deployment_id, resolution=MetricSample.Resolution.SECOND,
        created__gte=since).order_by("created").values_list("data", flat=True)
    return [dict(data.get("processes") or {}) for data in rows]


def latest_sample(deployment_id: int) -> Sample:
    row = (MetricSample.objects.filter(deployment_id=deployment_id,
                                       resolution=MetricSample.Resolution.SECOND)
           .order_by("-created").values_list("data", flat=True).first())
    return dict((row or {}).get("processes") or {})


def series(samples: list[Sample], slot: str, key: str) -> list[float]:
    return [float(value) for sample in samples
            if isinstance(value := sample.get(slot, {}).get(key), int | float)]


def _gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 3)


def resources(subject: Subject, idle: Sample, loaded: list[Sample]) -> Section:
    section = Section("resources")
    if not idle and not loaded:
        section.add("metric samples", WARN, "no metric samples of this deployment: is the "
                    "supervisor's metrics collector running?")
        return section
    workers: dict[str, dict[str, Any]] = {}
    by_node: dict[str, dict[str, float]] = {}
    for worker in subject.workers:
        rss_idle = idle.get(worker.slot, {}).get("rss")
        peak = max(series(loaded, worker.slot, "rss"), default=None)
        kv_peak = max(series(loaded, worker.slot, "kv_usage"), default=None)
        workers[worker.slot] = {"node": worker.node, "rss_idle_gib": _gib(rss_idle),
                                "rss_peak_gib": _gib(peak), "kv_usage_peak": kv_peak,
                                "kv_usage_idle": idle.get(worker.slot, {}).get("kv_usage")}
        node = by_node.setdefault(worker.node, {"memory": worker.node_memory_bytes, "idle": 0.0,
                                                "peak": 0.0})
        node["idle"] += float(rss_idle or 0)
        node["peak"] += float(peak if peak is not None else rss_idle or 0)
        if worker.gpu_memory_bytes or series(loaded, worker.slot, "gpu_mem"):
            _gpu(section, worker.slot, worker.gpu_memory_bytes,
                 idle.get(worker.slot, {}).get("gpu_mem"),
                 max(series(loaded, worker.slot, "gpu_mem"), default=None),
                 workers[worker.slot])
        if kv_peak is not None and kv_peak >= KV_WARN:
            section.add(f"KV cache {worker.slot}", WARN,
                        f"{worker.slot}: KV cache {kv_peak:.0%} full under the sweep (requests "
                        "queue or are preempted)", kv_usage_peak=kv_peak)
    for name, node in by_node.items():
        if not node["memory"]:
            section.add(f"memory on {name}", WARN, f"{name}: the node's memory is not known")
            continue
        idle_share, peak_share = node["idle"] / node["memory"], node["peak"] / node["memory"]
        numbers = {"node_memory_gib": _gib(node["memory"]), "idle_gib": _gib(node["idle"]),
                   "peak_gib": _gib(node["peak"]), "idle_share": round(idle_share, 3),
                   "peak_share": round(peak_share, 3)}
        if idle_share >= FAIL_SHARE or peak_share >= FAIL_SHARE:
            verdict = FAIL
        elif idle_share >= WARN_SHARE or peak_share >= WARN_SHARE:
            verdict = WARN
        else:
            verdict = PASS
        section.add(f"memory on {name}", verdict,
                    f"{name}: workers hold {idle_share:.0%} of {node['memory'] / GIB:.1f} GiB at "
                    f"idle, {peak_share:.0%} under load", **numbers)
    section.numbers = {"workers": workers}
    return section


def _gpu(section: Section, slot: str, capacity: int, idle: float | None, peak: float | None,
         numbers: dict[str, Any]) -> None:
    """One worker's GPU memory (the driver's per-process accounting) against its GPUs'."""
    gpu = {"gpu_idle_gib": _gib(idle), "gpu_peak_gib": _gib(peak),
           "gpu_memory_gib": _gib(capacity or None)}
    numbers.update(gpu)
    held = peak if peak is not None else idle
    if held is None:
        section.add(f"GPU memory {slot}", WARN, f"{slot}: the GPU driver lists no memory of "
                    "its processes (no NVIDIA driver where the collector runs?)")
        return
    if not capacity:
        section.add(f"GPU memory {slot}", WARN, f"{slot}: holds {held / GIB:.1f} GiB of GPU "
                    "memory on GPUs the plan does not name", **gpu)
        return
    share = held / capacity
    verdict = FAIL if share >= GPU_FAIL_SHARE else WARN if share >= GPU_WARN_SHARE else PASS
    section.add(f"GPU memory {slot}", verdict,
                f"{slot}: {share:.0%} of its GPUs' {capacity / GIB:.1f} GiB "
                f"({(idle or 0) / GIB:.1f} GiB at idle, {held / GIB:.1f} GiB at most under load)",
                gpu_share=round(share, 3), **gpu)
