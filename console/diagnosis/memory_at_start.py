"""Symptom 3, out of memory at start: vLLM's refusal to start for want of KV cache memory, an
allocation that failed, a worker killed by the kernel (SIGKILL) before it was ever ready, and
the memory the pre-flight check estimated or the collector measured near the node's limit."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from console.alerts.symptom_links import OOM_AT_START
from console.diagnosis import log_patterns as logs
from console.diagnosis.observations import Observations, series
from console.diagnosis.symptoms import (
    Cause,
    Diagnosis,
    Evidence,
    Fix,
    alert_evidence,
    check_evidence,
    judge,
    log_evidence,
)

# What the kernel's OOM killer leaves: the leader killed by SIGKILL (Popen's -9), or a shell's
# 128 + 9 when a wrapper reported it.
KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)
NEAR_LIMIT = 0.9
WINDOW_S = 300


def diagnose(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    kv = node = context = 0.0
    suggested: int | None = None

    for hit in obs.logs_of(logs.OOM_KV, logs.OOM_NO_CACHE):
        evidence.append(log_evidence(hit))
        kv += 3
        suggested = logs.estimated_max_len(hit.text) or suggested
    for hit in obs.logs_of(logs.OOM, logs.OOM_KILLED):
        evidence.append(log_evidence(hit))
        node += 3
    for hit in obs.logs_of(logs.CONTEXT_TOO_LONG):
        evidence.append(log_evidence(hit))
        context += 3

    for process in obs.processes:
        # A kill the supervisor sent itself (a stop's escalation, a stalled start) is no OOM.
        if (process.role == "router" or process.exit_code not in KILLED
                or process.state != "failed" or "wrote nothing" in process.last_error):
            continue
        never_ready = process.ready_at is None  # the supervisor clears it at every spawn
        evidence.append(Evidence(
            f"{process.slot} was killed by SIGKILL (exit code {process.exit_code})"
            + (" before it was ever ready: the kernel's OOM killer is the usual sender"
               if never_ready else ""), "process", process.started_at, process.log_url,
            strong=never_ready))
        node += 2 if never_ready else 1

    ratio = series(obs.recent(WINDOW_S), _memory_ratio(obs))
    if ratio:
        at, slot, top = max(ratio, key=lambda p: p[2])
        if top > NEAR_LIMIT:
            evidence.append(Evidence(f"{slot} used {top:.0%} of its node's memory at "
                                     f"{at:%H:%M:%S}", "metrics", at, obs.metrics_url))
            node += 1

    failing = bool(obs.failing())
    for check in obs.checks_of("memory.fit"):
        evidence.append(check_evidence(check, failing))
        weight = 2 if check.severity == "error" else 1
        if "KV cache" in check.message:
            kv += weight
        else:
            node += weight
    for check in obs.checks_of("context.length", severity="error"):
        evidence.append(check_evidence(check, failing))
        context += 2
    for alert in obs.alerts_of(OOM_AT_START):
        evidence.append(alert_evidence(alert))
        node += 1

    plan = obs.plan
    shorter = (f"; vLLM estimated that {suggested} tokens would fit" if suggested else "")
    causes = [
        Cause("kv-cache", f"the KV cache ({plan.kv_cache_gib} GiB a worker) cannot hold a "
              f"request at the context length ({plan.max_model_len} tokens){shorter}", kv, (
                  Fix("lower the context length", "plan:max_model_len"),
                  Fix("or give each worker a larger KV cache", "plan:kv_cache_gib"),
                  Fix("or a smaller KV cache dtype (fp8)", "plan:kv_cache_dtype"))),
        Cause("node-memory", "weights, KV cache and the other processes exceed the node's "
              "memory: the allocation fails or the kernel kills the worker", node, (
                  Fix("serve a quantized variant (smaller weights)", "plan:variant"),
                  Fix("or shrink the KV cache or the concurrency it is sized for",
                      "plan:kv_cache_gib"),
                  Fix("or place fewer instances on the node", "plan:instances"))),
        Cause("context-beyond-model", "the context length is longer than the model allows "
              "(its max_position_embeddings)", context, (
                  Fix("set the context length within the model's", "plan:max_model_len"),)),
    ]
    return judge(OOM_AT_START, evidence, causes)


def _memory_ratio(obs: Observations) -> Callable[[str, dict[str, Any]], float | None]:
    totals = {p.slot: p.node_memory_bytes for p in obs.processes if p.node_memory_bytes}

    def read(slot: str, entry: dict[str, Any]) -> float | None:
        rss, total = entry.get("rss"), totals.get(slot)
        return float(rss) / total if isinstance(rss, int | float) and total else None

    return read
