"""What the troubleshooting view knows about a deployment at one moment: plain values gathered
from the console's tables (services.gather), so that the rules are pure functions of them and a
test can build them by hand or from rows."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class PlannedWorker:
    slot: str
    role: str
    variant: str
    path: str
    quantized: bool


@dataclass(frozen=True)
class Plan:
    name: str
    mode: str  # "pd" | "colocated"
    running: bool  # the operator wants it running
    kv_channel: str
    kv_load_failure: str
    max_model_len: int
    concurrency: int
    kv_cache_gib: int
    ttft_slo_s: float
    tpot_slo_s: float
    pd_policy: str
    decode_policy: str
    prefill_policy: str
    workers: tuple[PlannedWorker, ...]

    def instances(self, role: str) -> int:
        return sum(1 for w in self.workers if w.role == role)

    @property
    def generator(self) -> str:
        """The role that generates tokens: decode in PD, colocated otherwise."""
        return "decode" if self.mode == "pd" else "colocated"


@dataclass(frozen=True)
class ProcessFact:
    slot: str
    role: str
    state: str
    restarts: int
    exit_code: int | None
    last_error: str
    started_at: datetime | None
    ready_at: datetime | None
    degraded: str
    log_url: str
    node_memory_bytes: int | None = None


@dataclass(frozen=True)
class Sample:
    """One 1 s snapshot of the collector: ``processes`` maps a slot to its entry."""

    at: datetime
    processes: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class LogHit:
    """A stored log line that matched a known pattern (log_patterns.py)."""

    slot: str
    seq: int
    at: datetime
    text: str
    kind: str
    url: str


@dataclass(frozen=True)
class CheckFact:
    id: str
    severity: str  # "error" | "warning"
    message: str
    hint: str


@dataclass(frozen=True)
class AlertFact:
    name: str
    # The ready-made rule's key (ready_made.py), or the series of a rule someone wrote.
    kind: str
    symptom: str | None
    state: str  # "firing" | "pending" | "nodata"
    since: datetime | None
    summary: str
    url: str


@dataclass(frozen=True)
class GateFact:
    state: str
    reasons: tuple[str, ...]
    finished_at: datetime | None
    url: str


@dataclass(frozen=True)
class Observations:
    plan: Plan
    now: datetime
    processes: tuple[ProcessFact, ...] = ()
    samples: tuple[Sample, ...] = ()  # oldest first
    logs: tuple[LogHit, ...] = ()
    checks: tuple[CheckFact, ...] = ()
    alerts: tuple[AlertFact, ...] = ()
    gate: GateFact | None = None
    metrics_url: str = ""

    def process(self, slot: str) -> ProcessFact | None:
        return next((p for p in self.processes if p.slot == slot), None)

    def logs_of(self, *kinds: str) -> list[LogHit]:
        return [hit for hit in self.logs if hit.kind in kinds]

    def checks_of(self, *ids: str, severity: str | None = None) -> list[CheckFact]:
        return [c for c in self.checks
                if c.id in ids and (severity is None or c.severity == severity)]

    def alerts_of(self, symptom: str) -> list[AlertFact]:
        return [a for a in self.alerts if a.symptom == symptom and a.state == "firing"]

    def failing(self, role: str | None = None) -> list[ProcessFact]:
        """Workers of a running deployment that failed or are restarting (not the router)."""
        if not self.plan.running:
            return []
        return [p for p in self.processes if p.role != "router" and (role is None or p.role == role)
                and (p.state == "failed" or (p.state == "starting" and p.restarts))]

    def recent(self, seconds: float) -> tuple[Sample, ...]:
        return tuple(s for s in self.samples if (self.now - s.at).total_seconds() <= seconds)


# ---- reading series out of samples ------------------------------------------------------------
def series(samples: Iterable[Sample], value: Callable[[str, dict[str, Any]], float | None],
           roles: Iterable[str] = ()) -> list[tuple[datetime, str, float]]:
    """(time, slot, value) of every process entry (of ``roles``, when given) with a value."""
    wanted = set(roles)
    points = []
    for sample in samples:
        for slot, entry in sample.processes.items():
            if wanted and entry.get("role") not in wanted:
                continue
            number = value(slot, entry)
            if number is not None:
                points.append((sample.at, slot, float(number)))
    return points


def key(name: str) -> Callable[[str, dict[str, Any]], float | None]:
    def read(_slot: str, entry: dict[str, Any]) -> float | None:
        number = entry.get(name)
        return None if number is None or isinstance(number, dict | list) else float(number)

    return read


def per_sample(samples: Iterable[Sample], name: str, role: str,
               fold: Callable[[list[float]], float] = sum) -> list[tuple[datetime, float]]:
    """One value a sample: ``name`` over the role's processes that carry it, folded."""
    out = []
    for sample in samples:
        values = [float(e[name]) for e in sample.processes.values()
                  if e.get("role") == role and isinstance(e.get(name), int | float)]
        if values:
            out.append((sample.at, fold(values)))
    return out


def mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def peak(points: list[tuple[datetime, float]]) -> tuple[datetime, float] | None:
    return max(points, key=lambda p: p[1]) if points else None
