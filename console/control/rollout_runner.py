"""The supervisor's part of a rollout: it moves each active rollout on from its stored state.

Every tick reads the rollout from the database and does the next thing its state asks for, so a
supervisor killed mid-rollout is replaced by one that goes on from the same row:

- starting: green's workers run beside blue's (``slots`` adds them to the reconcile); once all
  are ready, the output gate (if the revision wants one) or the first step; a worker that made
  no progress (no log line, no phase) for ``start_timeout_s`` rolls back (progress.py);
- gating: green's workers are scored against the base model's reference in a thread; green is
  not in the router yet, so no request reaches it before it passed;
- stepping: green's group is in the router at the step's weight; every interval the router's
  per-revision metrics are compared (console/rollouts/analysis.py); a window with too few
  requests on a side grows until both have their minimum, and one still short after
  ``max_inconclusive_s`` pauses the rollout for a person ("inconclusive: not enough traffic");
  a step ends when its hold is over and the last window passed; too many failed windows roll
  back;
- warm: green has all the traffic, blue stays up for the delay and until a window decided (a
  failed window still rolls back to it; a promote skips the wait);
  then, when the rollout asks for it, until a verification report of green alone passed (one
  that does not pass rolls back; a promote does not skip it);
- draining: blue's group takes no new requests and finishes its own; then the plan becomes the
  revision (its ports and variants), the processes' slots are swapped and blue's workers stop;
- rolling back: green's weight is 0 and its group drains, then green's workers stop.

The router's groups and weights are made equal to the stored ones on every tick, so a router
restarted mid-rollout gets green's group back (rollout_router.py); the in-place strategy's
pair-by-pair hand-over is in rollout_in_place.py, the gate's thread in rollout_gate.py, green's
own verification report in rollout_verification.py, the analysis windows in rollout_windows.py
and the promotion in rollout_promotion.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from console.audit.actors import acting_as
from console.audit.models import AuditEntry
from console.control.rollout_gate import GreenGate
from console.control.rollout_in_place import InPlace
from console.control.rollout_promotion import promote
from console.control.rollout_router import RouterGroups
from console.control.rollout_verification import MOVED, PASSED, GreenVerification
from console.control.rollout_windows import AnalysisWindows, Window
from console.control.worker_specs import ProcessSpec, green_slot, green_specs
from console.deployments import engine_args
from console.deployments.models import Deployment
from console.gateway.router_admin import AdminUnreadable
from console.quality.models import GateResult
from console.rollouts import analysis, green_progress
from console.rollouts.machine import broadcast, move
from console.rollouts.models import Revision, Rollout
from console.rollouts.services import DEFAULT_MAX_INCONCLUSIVE_S
from console.supervisor.engine import Child
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.rollouts")
# How services.promote's transitions begin (warm then skips waiting on the analysis).
PROMOTED = "promoted by"
State = Rollout.State
Strategy = Rollout.Strategy


@dataclass
class RolloutRunner(RouterGroups, InPlace, GreenGate, GreenVerification, AnalysisWindows):
    # rollout id -> the gate thread scoring its green
    gates: dict[int, threading.Thread] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)
    # rollout id -> the analysis window being collected
    windows: dict[int, Window] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic

    # ---- what the reconcile runs -------------------------------------------------------
    def specs(self, deployment: Deployment) -> list[ProcessSpec]:
        """Green's process specs while its rollout needs green's workers up (in place: the
        pairs green holds now)."""
        rollout = _active(deployment)
        if rollout is None:
            return []
        if rollout.strategy == Strategy.IN_PLACE:
            return green_specs(deployment, rollout, set(rollout.units.get("green", [])))
        return green_specs(deployment, rollout)

    @staticmethod
    def held_back(deployment: Deployment) -> frozenset[str]:
        """In place: the plan's slots green holds or that are changing hands."""
        rollout = _active(deployment)
        if rollout is None or rollout.strategy != Strategy.IN_PLACE:
            return frozenset()
        taken = set(rollout.units.get("green", []))
        transit = rollout.units.get("transit")
        if transit is not None:
            # Going forward, blue's pair drains and stops; rolling back, it starts again once
            # green's copy of it has stopped (the two share ports).
            green_gone = rollout.state == State.ROLLING_BACK and not InPlace._alive(
                rollout, [green_slot(w.slot, rollout.green)
                          for w in deployment.workers.filter(index=transit)])
            if not green_gone:
                taken.add(transit)
        return frozenset(w.slot for w in deployment.workers.all() if w.index in taken)

    # ---- the tick ------------------------------------------------------------------------
    def step(self, children: dict[int, Child]) -> bool:
        did = False
        active = list(Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).select_related(
            "deployment", "from_revision", "to_revision"))
        # Windows of rollouts no longer active (ended by a user or another supervisor) go.
        self.windows = {k: v for k, v in self.windows.items() if k in {r.pk for r in active}}
        for rollout in active:
            if rollout.deployment.desired_state != Deployment.DesiredState.RUNNING:
                continue
            try:
                with acting_as(AuditEntry.Actor.SYSTEM, "supervisor"):
                    did = self._advance(rollout, children) or did
            except AdminUnreadable as exc:
                log.info("rollout #%d: router admin API unreadable (%s); asked again", rollout.pk,
                         exc)
            except Exception:
                # One rollout's bug must not end the supervisor (its loop stops every process
                # when a tick raises): the rollout stays in its state and is tried again.
                log.exception("rollout #%d: its step failed in %s; tried again next tick",
                              rollout.pk, rollout.state)
        return did

    def _advance(self, rollout: Rollout, children: dict[int, Child]) -> bool:
        state = rollout.state
        if rollout.strategy == Strategy.IN_PLACE and state in (State.RELEASING,
                                                                State.ROLLING_BACK):
            return (self._releasing(rollout) if state == State.RELEASING
                    else self._in_place_back(rollout))
        if state == State.STARTING:
            return self._starting(rollout)
        if state == State.GATING:
            return self._gating(rollout)
        if state == State.PAUSED:
            self._sync_router(rollout)
            return False
        if state == State.STEPPING:
            return self._stepping(rollout)
        if state == State.WARM:
            return self._warm(rollout)
        if state == State.DRAINING:
            return self._draining(rollout, children)
        if state == State.ROLLING_BACK:
            return self._rolling_back(rollout)
        return False

    # ---- states --------------------------------------------------------------------------
    def _starting(self, rollout: Rollout) -> bool:
        # The promotion will check green's engine flags with vLLM's parser: imported now,
        # beside green's start, not at the promotion.
        engine_args.load_parser_in_background(rollout.green.spec.get(engine_args.FIELD))
        states = self._green_states(rollout)
        if states and set(states.values()) == {ManagedProcess.State.READY}:
            self._follow_start(rollout)
            if self._gate_wanted(rollout):
                move(rollout, State.GATING, "green's workers are ready; the output gate scores "
                     "them before any traffic", gate={"state": GateResult.State.QUEUED})
            else:
                self._enter_step(rollout, rollout.step_index, "green's workers are ready; the "
                                                              "revision's gate is off")
            return True
        workers = self._follow_start(rollout)
        stalled = green_progress.stalled(workers, rollout.start_timeout_s, timezone.now())
        if stalled:
            move(rollout, State.ROLLING_BACK, f"green did not become ready: "
                 f"{'; '.join(stalled)}"[:1000], weights=self._rollback_weights(rollout))
            return True
        return False

    def _follow_start(self, rollout: Rollout) -> dict[str, dict[str, object]]:
        """Green's workers' phases and last progress, stored on the rollout (and sent to its
        page when they changed)."""
        slots = [spec.slot for spec in self.specs(rollout.deployment)]
        before = rollout.progress.get("workers", {})
        workers = green_progress.follow(before, slots, rollout.deployment_id, rollout.state_since)
        if workers != before:
            self._store_progress(rollout, workers=workers)
        return workers

    @staticmethod
    def _store_progress(rollout: Rollout, **parts: object) -> None:
        rollout.progress = {**rollout.progress, **parts}
        Rollout.objects.filter(pk=rollout.pk).update(progress=rollout.progress)
        broadcast(rollouts=[rollout])

    def _gating(self, rollout: Rollout) -> bool:
        gate = rollout.gate or {}
        if gate.get("state") in (GateResult.State.PASSED, GateResult.State.FAILED,
                                 GateResult.State.ERROR):
            if gate["state"] == GateResult.State.PASSED:
                self._enter_step(rollout, rollout.step_index, "green passed the output gate")
            else:
                what = "failed" if gate["state"] == GateResult.State.FAILED else "could not run"
                detail = "; ".join(gate.get("report", {}).get("reasons", [])) or gate.get("error", "")
                move(rollout, State.ROLLING_BACK, f"green's output gate {what}: {detail}"[:1000],
                     weights=self._rollback_weights(rollout))
            return True
        thread = self.gates.get(rollout.pk)
        if thread is None or not thread.is_alive():
            # Not started yet, or started by a supervisor that is gone: (re)start it.
            thread = threading.Thread(target=self._run_gate, args=(rollout.pk,),
                                      name=f"rollout-gate-{rollout.pk}", daemon=True)
            self.gates[rollout.pk] = thread
            Rollout.objects.filter(pk=rollout.pk).update(gate={"state": GateResult.State.RUNNING})
            thread.start()
            return True
        return False

    def _stepping(self, rollout: Rollout) -> bool:
        step = rollout.steps[rollout.step_index]
        if rollout.step_since is None:
            # A step entered (or a promote) without weights yet: set them now.
            self._enter_step(rollout, rollout.step_index, rollout.reason)
            return True
        self._sync_router(rollout)
        in_place = rollout.strategy == Strategy.IN_PLACE
        if step["weight"] >= 100 and in_place:
            # Blue has no pair left to keep warm or compare with.
            self._delete_group(rollout, rollout.blue.label)
            move(rollout, State.DRAINING, "green holds every pair; blue's group drains")
            return True
        if step["weight"] >= 100:
            weights = {rollout.blue.label: 0, rollout.green.label: 100}
            move(rollout, State.WARM, f"green takes all the traffic; blue stays warm for "
                 f"{rollout.scale_down_delay_s} s", weights=weights)
            self._sync_router(Rollout.objects.get(pk=rollout.pk))
            return True
        verdict = self._analyse(rollout)
        if verdict == analysis.FAIL and self._failed_too_often(rollout):
            return True
        if verdict == analysis.INCONCLUSIVE:
            self._pause_inconclusive(rollout)
            return True
        held = (timezone.now() - rollout.step_since).total_seconds() >= step.get("hold_s", 0)
        if held and self._last_verdict(rollout) == analysis.PASS and in_place:
            move(rollout, State.RELEASING, f"pair {rollout.step_index + 1} held "
                 f"{step.get('hold_s', 0)} s and its analysis passed; blue's pair "
                 f"{rollout.step_index + 2} drains and stops for green's",
                 step_index=rollout.step_index + 1, step_since=None)
            return True
        if held and self._last_verdict(rollout) == analysis.PASS:
            self._enter_step(rollout, rollout.step_index + 1,
                             f"step {rollout.step_index + 1} held {step.get('hold_s', 0)} s and "
                             "its analysis passed")
            return True
        return verdict is not None

    def _warm(self, rollout: Rollout) -> bool:
        self._sync_router(rollout)
        verdict = self._analyse(rollout)
        if verdict == analysis.FAIL and self._failed_too_often(rollout):
            return True
        if verdict == analysis.INCONCLUSIVE:
            self._pause_inconclusive(rollout)
            return True
        if (timezone.now() - rollout.state_since).total_seconds() < rollout.scale_down_delay_s:
            return verdict is not None
        # Blue-green's one check: blue stays up until a window decided (as long as a window
        # is being collected: no router, nothing to judge), unless an operator promoted.
        decided = rollout.analyses.filter(at__gte=rollout.state_since,
                                          verdict=analysis.PASS).exists()
        if rollout.pk in self.windows and not decided and not self._promoted(rollout):
            return verdict is not None
        if rollout.verify_green and (verified := self._green_verified(rollout)) != PASSED:
            return verified == MOVED or verdict is not None
        self._delete_group(rollout, rollout.blue.label)
        move(rollout, State.DRAINING, f"blue r{rollout.blue.number} takes no new requests "
             f"and finishes its own (at most {rollout.drain_timeout_s} s)")
        return True

    @staticmethod
    def _promoted(rollout: Rollout) -> bool:
        """Whether an operator promoted it (skipping the analysis that remained)."""
        return rollout.transitions.filter(reason__startswith=PROMOTED).exists()

    def _pause_inconclusive(self, rollout: Rollout) -> None:
        bound = rollout.analysis.get("max_inconclusive_s", DEFAULT_MAX_INCONCLUSIVE_S)
        last = rollout.analyses.order_by("-at", "-pk").first()
        counts = ", ".join(f"r{label} {count:.0f}" for label, count in
                           sorted((last.requests if last else {}).items()))
        move(rollout, State.PAUSED, f"inconclusive: not enough traffic (fewer than "
             f"{rollout.analysis['min_requests']} requests on a side after {bound:.0f} s: "
             f"{counts or 'none'}); promote or roll back", paused_from=rollout.state)
        self.windows.pop(rollout.pk, None)
        self._store_progress(rollout, window=None)

    def _draining(self, rollout: Rollout, children: dict[int, Child]) -> bool:
        if not self._drained(rollout, rollout.blue.label):
            return False
        promote(rollout, children)
        self._close_window(rollout)
        return True

    def _rolling_back(self, rollout: Rollout) -> bool:
        if self._router_ready(rollout.deployment):
            groups = self._groups(rollout.deployment)
            if rollout.green.label in groups and groups[rollout.green.label]["state"] != "draining":
                self._put_weights(rollout.deployment, {rollout.blue.label: 100,
                                                       rollout.green.label: 0})
                self._delete_group(rollout, rollout.green.label)
        if not self._drained(rollout, rollout.green.label):
            return False
        with transaction.atomic():
            if rollout.green.state == Revision.State.DRAFT:
                Revision.objects.filter(pk=rollout.green.pk).update(state=Revision.State.FAILED)
            move(rollout, State.ROLLED_BACK, f"rolled back: blue r{rollout.blue.number} serves "
                 f"everything; green's workers stop ({rollout.reason})"[:1000])
        self._close_window(rollout)
        return True

    def _close_window(self, rollout: Rollout) -> None:
        """An ended rollout collects no more: its page stops showing a window."""
        self.windows.pop(rollout.pk, None)
        if rollout.progress.get("window"):
            self._store_progress(rollout, window=None)

    # ---- steps and analysis --------------------------------------------------------------
    def _enter_step(self, rollout: Rollout, index: int, reason: str) -> None:
        weight = rollout.steps[index]["weight"]
        weights = {rollout.blue.label: 100 - weight, rollout.green.label: weight}
        move(rollout, State.STEPPING, f"{reason}; step {index + 1} of {len(rollout.steps)}: "
             f"green takes {weight}%", step_index=index, weights=weights,
             step_since=timezone.now(), failures=0)
        self._sync_router(Rollout.objects.get(pk=rollout.pk))
        # The analysis window starts with the new weights.
        self.windows.pop(rollout.pk, None)
        if rollout.progress.get("window"):
            self._store_progress(rollout, window=None)

    def _failed_too_often(self, rollout: Rollout) -> bool:
        if rollout.failures <= rollout.analysis["failure_limit"]:
            return False
        last = rollout.analyses.order_by("-at", "-pk").first()
        failed = ", ".join(f"{name} {row['why']}" for name, row in (last.metrics if last else {}).items()
                           if row["verdict"] == analysis.FAIL)
        move(rollout, State.ROLLING_BACK, f"analysis failed {rollout.failures} times (limit "
             f"{rollout.analysis['failure_limit']}): {failed}"[:1000],
             weights=self._rollback_weights(rollout))
        self._sync_router(Rollout.objects.get(pk=rollout.pk))
        return True

    # ---- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _rollback_weights(rollout: Rollout) -> dict[str, int]:
        if rollout.strategy == Strategy.IN_PLACE:
            # Green keeps its pairs' share until each is handed back (_in_place_back).
            return dict(rollout.weights)
        return {rollout.blue.label: 100, rollout.green.label: 0}

    @staticmethod
    def _green_states(rollout: Rollout) -> dict[str, str]:
        # This rollout's green slots only: rows of an earlier green of the same revision
        # number keep its suffix (an instance the autoscaler had added to a green rolled back
        # since, stopped for good). A retired blue's rows do not: ``slot@rN-retired``.
        slots = [green_slot(slot, rollout.green) for slot in rollout.green_ports]
        return dict(ManagedProcess.objects.filter(
            deployment=rollout.deployment_id, slot__in=slots).values_list("slot", "state"))

    def stop(self) -> None:
        self.stopping.set()


def _active(deployment: Deployment) -> Rollout | None:
    """The rollout whose green workers should run: every active one (a rolling-back green
    stops once drained, when the rollout is done)."""
    return (Rollout.objects.filter(deployment=deployment, state__in=Rollout.ACTIVE_STATES)
            .select_related("to_revision", "from_revision").first())
