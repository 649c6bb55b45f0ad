"""How far green's workers are in their start, and the deadline that follows it.

A start is timed out by its *progress*, as Argo Rollouts' ``progressDeadlineSeconds`` is: a
worker whose log still grows, whose load phase still moves or whose processes keep a core busy
is never failed; one that did none of these for the rollout's ``start_timeout_s`` is. The log
alone is not enough: a green decode compiling beside blue's decode on one core wrote no line for
7 min 42 s (`make up`, a rollout under a 2 req/s trickle) and was rolled back as hung while it
computed. Its CPU comes from the collector's 1 s samples (``cpu`` per slot, the process tree's).
A worker that keeps a core busy but writes nothing for ``SILENT_BUSY_FACTOR`` deadlines is failed
all the same (a transport busy-polling for a peer that never answers is busy, not progressing).

The phase comes from vLLM's own log lines (:func:`phase_of`), read from the stored log lines
(console/live/models.LogLine) after a cursor kept on the rollout's row, so that a new supervisor
goes on from where the last one read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from console.live.models import LogLine, MetricSample
from console.live.start_phase import PHASES, READY, STARTING, phase_of
from console.supervisor.models import ManagedProcess

# Restarts of one green worker while the rollout waits on it: past this, it is rolled back
# (a worker that crashes or is killed by the stall watchdog writes a new header each time,
# which would otherwise count as progress forever).
MAX_RESTARTS = 3
# Lines read per worker and tick (and 1 s samples per tick); the rest are read on the next tick.
READ_BATCH = 5000
# A worker's process tree using this much of one core in a 1 s sample is computing (vLLM's idle
# API server and engine core wait at a few per cent).
BUSY_CPU_PERCENT = 20.0
# Busy but silent in the log for this many deadlines: failed (see the module's doc).
SILENT_BUSY_FACTOR = 3

# The derived default of a rollout's start_timeout_s: this many times the slowest start the
# deployment's workers made, between the floor and the cap (see default_deadline).
DEADLINE_FACTOR = 3
DEADLINE_FLOOR_S = 300
DEADLINE_CAP_S = 3600
DEADLINE_NO_HISTORY_S = 600


def slowest_start_s(deployment_id: int) -> float | None:
    """The longest start (spawn to ready) recorded for the deployment's workers: every slot's
    last start, blue's and earlier rollouts' greens (``slot@rN``) alike."""
    rows = ManagedProcess.objects.filter(
        deployment_id=deployment_id, kind=ManagedProcess.Kind.WORKER,
        started_at__isnull=False, ready_at__isnull=False).values_list("started_at", "ready_at")
    spans = [(ready - started).total_seconds() for started, ready in rows if ready >= started]
    return max(spans) if spans else None


def default_deadline(deployment_id: int) -> tuple[int, str]:
    """The default start_timeout_s of a rollout of this deployment, and why: 3 x the slowest
    start its workers made (green starts beside blue, on cores blue still serves on: the user
    who measured it saw 5-10 min against 2 min alone), at least 300 s, at most an hour; 600 s
    without any recorded start."""
    slowest = slowest_start_s(deployment_id)
    if slowest is None:
        return DEADLINE_NO_HISTORY_S, "no start of its workers recorded yet"
    value = int(min(DEADLINE_CAP_S, max(DEADLINE_FLOOR_S, DEADLINE_FACTOR * slowest)))
    return value, f"{DEADLINE_FACTOR} x its slowest recorded start ({slowest:.0f} s)"


def _iso(value: datetime) -> str:
    return value.isoformat()


def follow(workers: dict[str, Any], slots: list[str], deployment_id: int,
           since: datetime) -> dict[str, Any]:
    """``workers`` (slot -> entry, as stored on the rollout) brought up to date with the
    process table, the log lines and the 1 s samples stored since each entry's cursors. An
    entry: ``{"phase", "phase_since", "progress_at", "log_at", "cpu", "cpu_read_at",
    "started_at", "restarts", "restarts_at_start", "line_id", "state", "error"}``; a slot
    without a process yet counts from ``since``."""
    rows = {row.slot: row for row in ManagedProcess.objects.filter(
        deployment_id=deployment_id, slot__in=slots)}
    updated: dict[str, Any] = {}
    for slot in slots:
        entry = dict(workers.get(slot) or {
            "phase": STARTING, "phase_since": _iso(since), "progress_at": _iso(since),
            "started_at": None, "line_id": 0, "restarts": 0, "restarts_at_start": None})
        entry.setdefault("log_at", entry["progress_at"])
        row = rows.get(slot)
        if row is not None:
            if entry["restarts_at_start"] is None:
                entry["restarts_at_start"] = row.restarts
            entry.update(restarts=row.restarts, state=row.state, error=row.last_error,
                         started_at=_iso(row.started_at) if row.started_at else None)
            # Lines of this process after the cursor (stored lines only: what a node agent's
            # workers print reaches the database the same way).
            lines = list(LogLine.objects.filter(Q(process_id=row.pk) & Q(id__gt=entry["line_id"]))
                         .order_by("id").values_list("id", "created", "text")[:READ_BATCH])
            for line_id, created, text in lines:
                entry["line_id"] = line_id
                _progressed(entry, created)
                if created > datetime.fromisoformat(entry["log_at"]):
                    entry["log_at"] = created.isoformat()
                phase = phase_of(text)
                # Phases move forward, except that a (re)start begins again.
                if phase is not None and (phase == STARTING
                                          or PHASES.index(phase) > PHASES.index(entry["phase"])):
                    if phase != entry["phase"]:
                        entry["phase"], entry["phase_since"] = phase, created.isoformat()
            if row.state == ManagedProcess.State.READY and entry["phase"] != READY:
                at = row.ready_at or timezone.now()
                entry["phase"], entry["phase_since"] = READY, _iso(at)
                _progressed(entry, at)
            elif row.state != ManagedProcess.State.READY and entry["phase"] == READY:
                # Ready once, then its health check failed or it restarted.
                entry["phase"] = STARTING
        updated[slot] = entry
    _read_cpu(updated, deployment_id, since)
    return updated


def _progressed(entry: dict[str, Any], at: datetime) -> None:
    if at > datetime.fromisoformat(entry["progress_at"]):
        entry["progress_at"] = _iso(at)


def _read_cpu(workers: dict[str, Any], deployment_id: int, since: datetime) -> None:
    """Each worker's CPU from the 1 s samples after its cursor: the last reading is shown, and
    a busy one is progress."""
    cursors = {slot: datetime.fromisoformat(entry.get("cpu_read_at") or _iso(since))
               for slot, entry in workers.items()}
    if not cursors:
        return
    rows = list(MetricSample.objects.filter(
        deployment_id=deployment_id, resolution=MetricSample.Resolution.SECOND,
        created__gt=min(cursors.values())).order_by("created").values_list(
        "created", "data")[:READ_BATCH])
    for created, data in rows:
        processes = data.get("processes") or {}
        for slot, entry in workers.items():
            cpu = (processes.get(slot) or {}).get("cpu")
            if created <= cursors[slot] or not isinstance(cpu, int | float):
                continue
            entry["cpu"] = cpu
            if cpu >= BUSY_CPU_PERCENT:
                _progressed(entry, created)
    if rows:
        # Every cursor past what was read, a slot absent from those samples too (its process
        # not spawned yet): the next tick reads only newer samples.
        last = rows[-1][0]
        for slot, entry in workers.items():
            if last > cursors[slot]:
                entry["cpu_read_at"] = _iso(last)


def stalled(workers: dict[str, Any], deadline_s: float, now: datetime) -> list[str]:
    """Why each worker that is not ready fails the deadline: no progress for ``deadline_s``,
    or too many restarts. Empty when every one still progresses."""
    reasons = []
    for slot, entry in sorted(workers.items()):
        if entry["phase"] == READY:
            continue
        idle = (now - datetime.fromisoformat(entry["progress_at"])).total_seconds()
        silent = (now - datetime.fromisoformat(entry.get("log_at") or entry["progress_at"])
                  ).total_seconds()
        first = entry["restarts_at_start"]
        restarted = entry["restarts"] - (entry["restarts"] if first is None else first)
        if restarted >= MAX_RESTARTS:
            reasons.append(f"{slot} restarted {restarted} times while starting"
                           + (f" ({entry['error']})" if entry.get("error") else ""))
        elif idle > deadline_s:
            reasons.append(f"{slot} made no progress for {idle:.0f} s (deadline {deadline_s:.0f} s "
                           f"without progress; last phase: {entry['phase']})")
        elif silent > SILENT_BUSY_FACTOR * deadline_s:
            reasons.append(f"{slot} wrote no log line for {silent:.0f} s although busy on a core "
                           f"({SILENT_BUSY_FACTOR} x the deadline of {deadline_s:.0f} s; last "
                           f"phase: {entry['phase']})")
    return reasons
