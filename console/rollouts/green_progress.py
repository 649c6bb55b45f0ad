"""How far green's workers are in their start, and the deadline that follows it.

A start is timed out by its *progress*, as Argo Rollouts' ``progressDeadlineSeconds`` is: a
worker whose log still grows or whose load phase still moves is never failed; one that wrote
nothing for the rollout's ``start_timeout_s`` is. vLLM on a busy CPU may compile for minutes,
but every phase logs (the engine core itself writes "No available shared memory broadcast block
found in 60 seconds" each minute it waits on a busy worker), so silence for minutes means hung.

The phase comes from vLLM's own log lines (:func:`phase_of`), read from the stored log lines
(console/live/models.LogLine) after a cursor kept on the rollout's row, so that a new supervisor
goes on from where the last one read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from console.live.models import LogLine
from console.live.start_phase import PHASES, READY, STARTING, phase_of
from console.supervisor.models import ManagedProcess

# Restarts of one green worker while the rollout waits on it: past this, it is rolled back
# (a worker that crashes or is killed by the stall watchdog writes a new header each time,
# which would otherwise count as progress forever).
MAX_RESTARTS = 3
# Lines read per worker and tick; the rest are read on the next tick.
READ_BATCH = 5000

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
    who measured it saw 5-10 min against 2 min alone), at least 300 s (above the 60 s cadence
    at which even a busy vLLM logs), at most an hour; 600 s without any recorded start."""
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
    process table and the log lines stored since each entry's cursor. An entry:
    ``{"phase", "phase_since", "progress_at", "started_at", "restarts", "restarts_at_start",
    "line_id", "state", "error"}``; a slot without a process yet counts from ``since``."""
    rows = {row.slot: row for row in ManagedProcess.objects.filter(
        deployment_id=deployment_id, slot__in=slots)}
    updated: dict[str, Any] = {}
    for slot in slots:
        entry = dict(workers.get(slot) or {
            "phase": STARTING, "phase_since": _iso(since), "progress_at": _iso(since),
            "started_at": None, "line_id": 0, "restarts": 0, "restarts_at_start": None})
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
                if created > datetime.fromisoformat(entry["progress_at"]):
                    entry["progress_at"] = created.isoformat()
                phase = phase_of(text)
                # Phases move forward, except that a (re)start begins again.
                if phase is not None and (phase == STARTING
                                          or PHASES.index(phase) > PHASES.index(entry["phase"])):
                    if phase != entry["phase"]:
                        entry["phase"], entry["phase_since"] = phase, created.isoformat()
            if row.state == ManagedProcess.State.READY and entry["phase"] != READY:
                at = row.ready_at or timezone.now()
                entry["phase"], entry["phase_since"] = READY, _iso(at)
                if at > datetime.fromisoformat(entry["progress_at"]):
                    entry["progress_at"] = _iso(at)
            elif row.state != ManagedProcess.State.READY and entry["phase"] == READY:
                # Ready once, then its health check failed or it restarted.
                entry["phase"] = STARTING
        updated[slot] = entry
    return updated


def stalled(workers: dict[str, Any], deadline_s: float, now: datetime) -> list[str]:
    """Why each worker that is not ready fails the deadline: no progress for ``deadline_s``,
    or too many restarts. Empty when every one still progresses."""
    reasons = []
    for slot, entry in sorted(workers.items()):
        if entry["phase"] == READY:
            continue
        idle = (now - datetime.fromisoformat(entry["progress_at"])).total_seconds()
        first = entry["restarts_at_start"]
        restarted = entry["restarts"] - (entry["restarts"] if first is None else first)
        if restarted >= MAX_RESTARTS:
            reasons.append(f"{slot} restarted {restarted} times while starting"
                           + (f" ({entry['error']})" if entry.get("error") else ""))
        elif idle > deadline_s:
            reasons.append(f"{slot} made no progress for {idle:.0f} s (deadline {deadline_s:.0f} s "
                           f"without progress; last phase: {entry['phase']})")
    return reasons
