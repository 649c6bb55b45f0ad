"""Rollout changes as websocket messages, on the deployment's live socket
(``/ws/deployments/<id>/live/``, group ``deployment-<id>``): the rollout page listens there for
``{"type": "rollout", ...}`` beside the metric snapshots.

The console's hub (embedded mode) polls the stored transitions and analysis windows with
:class:`RolloutSource`; with Redis, whoever stores them sends :func:`rollout_messages` itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from console.live.groups import deployment_group
from console.rollouts.models import AnalysisRun, Rollout, RolloutTransition

Message = tuple[str, dict[str, Any]]


def transition_payload(row: RolloutTransition) -> dict[str, Any]:
    return {"at": row.at.isoformat(), "from_state": row.from_state, "to_state": row.to_state,
            "actor": row.actor, "reason": row.reason, "weights": row.weights}


def analysis_payload(run: AnalysisRun) -> dict[str, Any]:
    return {"at": run.at.isoformat(), "step_index": run.step_index, "window_s": run.window_s,
            "verdict": run.verdict, "metrics": run.metrics, "requests": run.requests}


def rollout_state(rollout: Rollout) -> dict[str, Any]:
    """What the page shows of the rollout itself, as it is now."""
    return {"id": rollout.pk, "deployment": rollout.deployment_id, "state": rollout.state,
            "paused_from": rollout.paused_from, "step_index": rollout.step_index,
            "steps": rollout.steps, "weights": rollout.weights, "failures": rollout.failures,
            "gate": rollout.gate, "reason": rollout.reason, "active": rollout.active,
            "blue": rollout.from_revision.label, "green": rollout.to_revision.label,
            "state_since": rollout.state_since.isoformat(),
            "start_timeout_s": rollout.start_timeout_s, "progress": rollout.progress,
            "min_requests": rollout.analysis.get("min_requests")}


def rollout_messages(transitions: Iterable[RolloutTransition] = (),
                     analyses: Iterable[AnalysisRun] = (),
                     rollouts: Iterable[Rollout] = ()) -> list[Message]:
    """One message per rollout touched: its state now, and the new rows in order (none for a
    rollout in ``rollouts``, whose progress changed)."""
    new_transitions: dict[int, list[RolloutTransition]] = {}
    new_analyses: dict[int, list[AnalysisRun]] = {}
    for row in transitions:
        new_transitions.setdefault(row.rollout_id, []).append(row)
    for run in analyses:
        new_analyses.setdefault(run.rollout_id, []).append(run)
    ids = set(new_transitions) | set(new_analyses) | {rollout.pk for rollout in rollouts}
    if not ids:
        return []
    rows = Rollout.objects.filter(pk__in=ids).select_related("from_revision", "to_revision")
    return [(deployment_group(rollout.deployment_id), {
        "type": "rollout", "rollout": rollout_state(rollout),
        "transitions": [transition_payload(t) for t in new_transitions.get(rollout.pk, [])],
        "analyses": [analysis_payload(a) for a in new_analyses.get(rollout.pk, [])],
    }) for rollout in sorted(rows, key=lambda r: r.pk)]


class RolloutSource:
    """For the console's hub (embedded mode): the transitions and analysis windows stored since
    the last poll, and the active rollouts whose progress (green's start, the window being
    collected) changed, looked at once a second."""

    PROGRESS_EVERY_S = 1.0

    def __init__(self) -> None:
        self.last_transition_id = 0
        self.last_analysis_id = 0
        self.progress_seen: dict[int, Any] = {}
        self.progress_checked = 0.0

    def start_from_now(self) -> None:
        self.last_transition_id = (RolloutTransition.objects.order_by("-id")
                                   .values_list("id", flat=True).first() or 0)
        self.last_analysis_id = (AnalysisRun.objects.order_by("-id")
                                 .values_list("id", flat=True).first() or 0)
        self.progress_seen = dict(Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES)
                                  .values_list("pk", "progress"))

    def fetch(self) -> list[Message]:
        transitions = list(RolloutTransition.objects.filter(id__gt=self.last_transition_id)
                           .order_by("id")[:500])
        analyses = list(AnalysisRun.objects.filter(id__gt=self.last_analysis_id)
                        .order_by("id")[:500])
        if transitions:
            self.last_transition_id = transitions[-1].id
        if analyses:
            self.last_analysis_id = analyses[-1].id
        return rollout_messages(transitions, analyses, self._progressed())

    def _progressed(self) -> list[Rollout]:
        now = time.monotonic()
        if now - self.progress_checked < self.PROGRESS_EVERY_S:
            return []
        self.progress_checked = now
        current = dict(Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES)
                       .values_list("pk", "progress"))
        changed = [pk for pk, value in current.items() if self.progress_seen.get(pk) != value]
        self.progress_seen = current
        return list(Rollout.objects.filter(pk__in=changed))
