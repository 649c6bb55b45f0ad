"""A deployment's stored snapshots as the alert evaluator reads them, shared by the evaluator,
the rule preview and the Prometheus gauges so that the three cannot drift apart: a process
coming up for the first time is left out (a start is not an outage), a planned worker missing
from a snapshot is down, memory is read against the node's, and per-pair hand-off counters
become the hand-offs since the previous snapshot."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from console.alerts import series as catalog
from console.alerts.models import AlertRule, Scope
from console.supervisor.models import ManagedProcess


def first_starts(planned: Any, processes: dict[str, ManagedProcess]) -> set[str]:
    """Slots that are coming up for the first time since the deployment was started: not
    yet an outage. A restart after a crash counts (``restarts`` > 0)."""
    starting = set()
    # The process rows too: a rollout's green workers (``decode-0@r2``) are in no plan yet,
    # and their first start fired WorkerDown while blue served.
    for slot in {*planned, "router", *processes}:
        process = processes.get(slot)
        if process is None or (process.restarts == 0 and process.ready_at is None
                               and process.state != ManagedProcess.State.FAILED):
            starting.add(slot)
    return starting


def first_ready(processes: dict[str, ManagedProcess]) -> dict[str, float]:
    """When each slot first became ready since the deployment was started: its snapshots from
    before then belong to its start, not to an outage."""
    return {slot: process.ready_at.timestamp() for slot, process in processes.items()
            if process.restarts == 0 and process.ready_at is not None}


def frame(at: float, processes: dict[str, dict[str, Any]], planned: dict[str, Any],
          starting: set[str], memory: dict[str, int], previous: catalog.Frame | None,
          ready_since: dict[str, float] | None = None) -> catalog.Frame:
    """One snapshot as rules read it. ``starting``: slots in their first start, left out;
    ``ready_since``: slots left out of the snapshots taken before they first became ready."""
    ready_since = ready_since or {}
    left_out = {*starting, *(slot for slot, ready in ready_since.items() if at < ready)}
    entries: dict[str, dict[str, Any]] = {}
    for slot, entry in processes.items():
        if slot in left_out:
            continue
        entry = dict(entry)
        rss, total = entry.get("rss"), memory.get(slot)
        if rss is not None and total:
            entry["memory_ratio"] = rss / total
        entries[slot] = entry
    for slot, worker in planned.items():
        if slot not in entries and slot not in left_out:
            entries[slot] = {"role": worker.role, "up": 0}  # planned and running, not scraped
    if "router" in entries and "handoffs" in entries["router"]:
        before = previous.processes.get("router", {}) if previous else {}
        entries["router"]["handoffs_now"] = _handoff_deltas(before.get("handoffs"),
                                                            entries["router"]["handoffs"])
    # A role whose worker is still starting is neither ready nor missing yet.
    facts = catalog.deployment_facts(entries, complete=not any(slot in left_out
                                                                for slot in planned))
    return catalog.Frame(at, entries, facts)


def _handoff_deltas(before: list[dict[str, Any]] | None, now: list[dict[str, Any]]
                    ) -> dict[str, float]:
    """Hand-offs since the previous snapshot; a counter that went back was restarted."""
    old = {(row["prefill"], row["decode"]): row for row in before or []}
    totals = {"ok": 0.0, "failed": 0.0}
    for row in now:
        prior = old.get((row["prefill"], row["decode"]))
        for outcome in totals:
            value = row[outcome]
            if prior is None:
                continue  # first sight of the pair: no interval to count over
            totals[outcome] += value - prior[outcome] if value >= prior[outcome] else value
    return totals


def grouped(definition: catalog.SeriesDef, points: dict[catalog.Instance, list[tuple[float, ...]]],
             scope: str) -> dict[catalog.Instance, list[tuple[float, ...]]]:
    """Instances folded to the rule's scope, point by point (instances share the snapshot's
    time)."""
    if not definition.per_process or scope == Scope.INSTANCE:
        return dict(points)
    buckets: dict[catalog.Instance, dict[float, list[tuple[float, ...]]]] = {}
    for (role, _slot), rows in points.items():
        key = (role, "") if scope == Scope.ROLE else ("", "")
        by_time = buckets.setdefault(key, {})
        for row in rows:
            by_time.setdefault(row[0], []).append(row)
    folded: dict[catalog.Instance, list[tuple[float, ...]]] = {}
    for key, by_time in buckets.items():
        series_rows = []
        for at in sorted(by_time):
            rows = by_time[at]
            if definition.is_ratio:
                series_rows.append((at, sum(r[1] for r in rows), sum(r[2] for r in rows)))
            else:
                series_rows.append((at, catalog.fold(definition, [r[1] for r in rows])))
        folded[key] = series_rows
    return folded


def expected(definition: catalog.SeriesDef, rule: AlertRule, planned: dict[str, Any],
              starting: set[str]) -> Iterable[catalog.Instance]:
    """The instances that should have data, so that a silent one is NoData, not forgotten."""
    if not definition.per_process or rule.scope == Scope.DEPLOYMENT:
        yield ("", "")
        return
    slots = {slot: worker.role for slot, worker in planned.items()} | {"router": "router"}
    for slot, role in slots.items():
        if role not in definition.roles or (rule.role and role != rule.role) or slot in starting:
            continue
        yield (role, "") if rule.scope == Scope.ROLE else (role, slot)
