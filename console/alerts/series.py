"""The series an alert rule may watch, read from the collector's 1 s snapshots and the facts the
evaluator gathers (planned slots, node memory, gate results, foreign port holders).

Each series names the Prometheus metrics it is computed from, so that the evaluator can tell a
worker whose scrape lacks one (a renamed vLLM metric would otherwise make a rule match nothing,
silently) and the rule export can write the same rule in PromQL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from inference import prom_snapshot as prom

Entry = dict[str, Any]
Fold = Literal["max", "min", "sum", "mean"]

WORKER_ROLES = ("prefill", "decode", "colocated")
ALL_ROLES = (*WORKER_ROLES, "router")


@dataclass(frozen=True)
class Frame:
    """One instant of a deployment: its processes' snapshot entries and the facts beside them."""

    at: float
    processes: dict[str, Entry]
    # Deployment-level facts, keyed by series name (e.g. "gate.failed": 1.0).
    facts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SeriesDef:
    name: str
    help: str
    unit: str
    roles: tuple[str, ...]  # the roles whose processes carry it; () for a deployment series
    fold: Fold  # how instances combine when a rule's scope is the role or the deployment
    sources: tuple[str, ...] = ()  # Prometheus metric families it is computed from
    value: Callable[[Entry], float | None] | None = None
    # A ratio series gives (numerator, denominator) per second instead of a value.
    ratio: Callable[[Entry], tuple[float, float] | None] | None = None

    @property
    def is_ratio(self) -> bool:
        return self.ratio is not None

    @property
    def per_process(self) -> bool:
        return bool(self.roles)


def _number(key: str) -> Callable[[Entry], float | None]:
    def read(entry: Entry) -> float | None:
        value = entry.get(key)
        return None if value is None else float(value)

    return read


def _status_ratio(entry: Entry) -> tuple[float, float] | None:
    by_status = entry.get("rps_by_status")
    if by_status is None:
        return None
    errors = math.fsum(rate for status, rate in by_status.items() if status.startswith("5"))
    return errors, math.fsum(by_status.values())


def _fallback_ratio(entry: Entry) -> tuple[float, float] | None:
    fallback, rps = entry.get("fallback_ps"), entry.get("rps")
    if fallback is None or rps is None:
        return None
    return float(fallback), float(rps)


def _handoff_ratio(entry: Entry) -> tuple[float, float] | None:
    """Failed hand-offs over all hand-offs this second, from the per-pair counters' deltas that
    the evaluator puts beside the snapshot (``handoffs_now``)."""
    now = entry.get("handoffs_now")
    if now is None:
        return None
    return float(now["failed"]), float(now["ok"] + now["failed"])


SERIES: dict[str, SeriesDef] = {s.name: s for s in (
    SeriesDef("process.up", "1 while the process answers its /metrics, 0 while it is down, "
              "starting or missing from a deployment that should run", "bool", ALL_ROLES, "min",
              value=_number("up")),
    SeriesDef("process.rss", "resident memory of the process and its descendants", "bytes",
              ALL_ROLES, "max", value=_number("rss")),
    SeriesDef("process.memory_ratio", "resident memory over the node's memory", "ratio",
              ALL_ROLES, "max", value=_number("memory_ratio")),
    SeriesDef("process.cpu", "CPU of the process tree, in % of one core", "%", ALL_ROLES, "max",
              value=_number("cpu")),
    SeriesDef("worker.waiting", "requests waiting in the engine's queue", "requests", WORKER_ROLES,
              "sum", (prom.WAITING,), _number("waiting")),
    SeriesDef("worker.running", "requests the engine is running", "requests", WORKER_ROLES, "sum",
              (prom.RUNNING,), _number("running")),
    SeriesDef("worker.kv_usage", "KV cache usage (1 = full)", "ratio", WORKER_ROLES, "max",
              (prom.KV_USAGE,), _number("kv_usage")),
    SeriesDef("worker.ttft_p95", "the engine's time to first token, p95", "s", WORKER_ROLES, "max",
              (prom.TTFT,), _number("ttft_p95")),
    SeriesDef("worker.tpot_p95", "the engine's time per output token, p95", "s", WORKER_ROLES,
              "max", (prom.TPOT,), _number("tpot_p95")),
    SeriesDef("worker.prompt_tps", "prompt tokens computed per second", "tokens/s", WORKER_ROLES,
              "sum", (prom.PROMPT_TOKENS,), _number("prompt_tps")),
    SeriesDef("worker.gen_tps", "tokens generated per second", "tokens/s", WORKER_ROLES, "sum",
              (prom.GENERATION_TOKENS,), _number("gen_tps")),
    SeriesDef("router.rps", "requests the router answered per second", "requests/s", ("router",),
              "sum", (prom.ROUTER_REQUESTS,), _number("rps")),
    SeriesDef("router.ttft_p95", "time to first byte at the router, p95", "s", ("router",), "max",
              (prom.ROUTER_FIRST_BYTE,), _number("ttft_p95")),
    SeriesDef("router.handoff_p95", "prefill plus KV hand-off at the router, p95", "s",
              ("router",), "max", (prom.ROUTER_PREFILL,), _number("handoff_p95")),
    SeriesDef("router.5xx_ratio", "answers with a 5xx status over all answers", "ratio",
              ("router",), "max", (prom.ROUTER_REQUESTS,), ratio=_status_ratio),
    SeriesDef("router.fallback_ratio", "PD requests whose prompt decode had to compute again "
              "over all requests", "ratio", ("router",), "max",
              (prom.ROUTER_FALLBACK, prom.ROUTER_REQUESTS), ratio=_fallback_ratio),
    SeriesDef("router.handoff_failed_ratio", "failed KV hand-offs over all hand-offs", "ratio",
              ("router",), "max", (prom.ROUTER_HANDOFFS,), ratio=_handoff_ratio),
    SeriesDef("deployment.ready_prefill", "prefill workers answering", "workers", (), "sum"),
    SeriesDef("deployment.ready_decode", "decode workers answering", "workers", (), "sum"),
    SeriesDef("deployment.one_sided", "1 while one role has a ready worker and the other none",
              "bool", (), "max"),
    SeriesDef("deployment.pd_load_skew", "|log2| of prefill's over decode's requests in flight "
              "per worker: 1 = one side carries twice the other's load", "log2", (), "max"),
    SeriesDef("deployment.foreign_ports", "planned ports bound by a process outside the "
              "deployment", "ports", (), "max"),
    SeriesDef("deployment.metrics_missing", "metric families that this deployment's rules need "
              "and a live worker's scrape lacks", "families", (), "max"),
    SeriesDef("deployment.gate_failed", "1 while the latest output gate failed", "bool", (),
              "max"),
    SeriesDef("deployment.scale_refused", "1 while the autoscaler cannot grow a pool because "
              "the node lacks the memory for another instance", "bool", (), "max"),
    SeriesDef("deployment.node_down", "nodes of the deployment's workers whose agent missed "
              "its heartbeats for the grace", "nodes", (), "max"),
    SeriesDef("deployment.gateway_shed_ps", "requests to the deployment that the gateway's "
              "queues refused per second: shed (429) or timed out waiting (503)", "requests/s",
              (), "max"),
)}


def get(name: str) -> SeriesDef:
    try:
        return SERIES[name]
    except KeyError:
        raise ValueError(f"unknown series {name!r}; known: {', '.join(sorted(SERIES))}") from None


def deployment_facts(processes: dict[str, Entry], complete: bool = True) -> dict[str, float]:
    """The deployment series that follow from one snapshot: ready workers per role, whether only
    one side is up, and the P:D load skew; the last two only from a ``complete`` snapshot (no
    planned worker left out while it starts)."""
    ready = {"prefill": 0, "decode": 0}
    for entry in processes.values():
        if entry.get("role") in ready and entry.get("up"):
            ready[entry["role"]] += 1
    facts = {"deployment.ready_prefill": float(ready["prefill"]),
             "deployment.ready_decode": float(ready["decode"])}
    pd = complete and any(entry.get("role") in ready for entry in processes.values())
    if pd:
        facts["deployment.one_sided"] = float((ready["prefill"] == 0) != (ready["decode"] == 0))
    router = processes.get("router", {})
    if router.get("gateway_shed_ps") is not None:
        facts["deployment.gateway_shed_ps"] = float(router["gateway_shed_ps"])
    in_flight = router.get("in_flight") or {}
    if pd and ready["prefill"] and ready["decode"] and in_flight:
        per_worker = {role: (sum(in_flight.get(role, {}).values()) + 1) / ready[role]
                      for role in ("prefill", "decode")}
        # +1 on each side: an idle deployment has no skew, and one request is not a trend.
        facts["deployment.pd_load_skew"] = round(abs(math.log2(per_worker["prefill"]
                                                               / per_worker["decode"])), 3)
    return facts


Instance = tuple[str, str]  # (role, slot); ("", "") for the deployment as a whole


def instance_points(series: SeriesDef, frames: Iterable[Frame], role: str = ""
                    ) -> dict[Instance, list[tuple[float, ...]]]:
    """Per process instance, the series' points: (t, value) or, for a ratio, (t, num, den).
    A deployment series has the one instance ("", "")."""
    points: dict[Instance, list[tuple[float, ...]]] = {}
    for frame in frames:
        if not series.per_process:
            value = frame.facts.get(series.name)
            if value is not None:
                points.setdefault(("", ""), []).append((frame.at, value))
            continue
        for slot, entry in frame.processes.items():
            entry_role = entry.get("role", "")
            if entry_role not in series.roles or (role and entry_role != role):
                continue
            if series.ratio is not None:
                pair = series.ratio(entry)
                if pair is not None:
                    points.setdefault((entry_role, slot), []).append((frame.at, *pair))
            elif series.value is not None:
                value = series.value(entry)
                if value is not None:
                    points.setdefault((entry_role, slot), []).append((frame.at, value))
    return points


_FOLDS: dict[str, Callable[[list[float]], float]] = {
    "max": max, "min": min, "sum": math.fsum, "mean": lambda values: math.fsum(values) / len(values),
}


def fold(series: SeriesDef, values: list[float]) -> float:
    return _FOLDS[series.fold](values)
