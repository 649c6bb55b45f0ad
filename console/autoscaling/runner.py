"""The autoscaler: every few seconds, each pool policy of each running deployment is read,
decided (console/autoscaling/decide.py) and, when the policy is active, acted on through the
plan (console/autoscaling/actions.py); the supervisor starts, joins, drains and stops.

Like the alert evaluator, every supervisor runs the loop and the one holding the database
lease ``autoscaler`` evaluates, so two consoles never both grow a pool. The stabilization
history lives in memory: a new holder starts with empty windows, which hold changes until the
windows are covered again (it never acts on less history than the policy asks for).

Each decision that changes or would change a pool is stored; the same decision made again in a
row (the same reason, counts and action) extends the stored one rather than adding a row. A
change's progress is followed after (console/autoscaling/progress.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone

from console.alerts import leases
from console.alerts.models import Fact
from console.alerts.snapshots import first_ready, first_starts
from console.audit.actors import acting_as
from console.audit.models import AuditEntry
from console.autoscaling import decide
from console.autoscaling.actions import Refused, resize
from console.autoscaling.models import (
    READINGS_KEPT_S,
    PoolPolicy,
    PoolReading,
    RatioBand,
    ScalingDecision,
)
from console.autoscaling.progress import follow
from console.autoscaling.scaling_messages import decision_message, reading_message
from console.autoscaling.schedules import scheduled_minimum
from console.autoscaling.signals import History, read
from console.deployments.models import Deployment
from console.live.groups import deployment_group, emit
from console.live.models import MetricSample, ProcessScrape
from console.live.periodic import Periodic
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.autoscaler")

LEASE_NAME = "autoscaler"
REFUSED_FACT = "deployment.scale_refused"
SECOND = MetricSample.Resolution.SECOND
# The refused fact is rewritten at least this often (the evaluator reads it for 60 s).
FACT_REFRESH = timedelta(seconds=15)


@dataclass
class _Pool:
    history: deque[tuple[float, int | None]] = field(default_factory=deque)
    # When a dry run would have changed the pool: its cooldown counts from there.
    dry_change_at: float | None = None


@dataclass
class _Evaluated:
    """One pool's evaluation this tick, between deciding and acting."""

    row: PoolPolicy
    decision: decide.Decision
    inputs: dict[str, Any]
    value: float | None


@dataclass
class TickReport:
    evaluated: bool
    pools: int = 0
    decisions: int = 0
    changes: int = 0
    seconds: float = 0.0


def policy_of(row: PoolPolicy) -> decide.Policy:
    return decide.Policy(min_instances=row.min_instances, max_instances=row.max_instances,
                         scale_up_at=row.scale_up_at, scale_down_at=row.scale_down_at,
                         up_window_s=row.up_window_s, down_window_s=row.down_window_s,
                         max_step=row.max_step, cooldown_s=row.cooldown_s)


class Autoscaler:
    def __init__(self, holder: str | None = None, interval_s: float | None = None,
                 lease_s: float | None = None) -> None:
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.interval_s = interval_s or settings.PDSERVE_AUTOSCALE_TICK_S
        self.lease_s = lease_s or 3 * self.interval_s
        self._held = False
        self._histories: dict[int, History] = {}
        self._pools: dict[tuple[int, str], _Pool] = {}
        # deployment id -> (the refused fact as last written, when)
        self._facts: dict[int, tuple[bool, datetime]] = {}
        self._loop = Periodic("autoscaler", self.interval_s, self.tick, log,
                              "an autoscaler evaluation failed; retrying", self._finish)

    # ---- one evaluation ----------------------------------------------------------------
    def tick(self, now: datetime | None = None) -> TickReport:
        started = time.perf_counter()
        now = now or timezone.now()
        if not leases.hold(LEASE_NAME, self.holder, self.lease_s, now):
            self._forget()
            return TickReport(evaluated=False)
        self._held = True
        report = TickReport(evaluated=True)
        policies: dict[int, list[PoolPolicy]] = {}
        for row in PoolPolicy.objects.exclude(mode=PoolPolicy.Mode.OFF).select_related(
                "deployment"):
            if row.deployment.desired_state == Deployment.DesiredState.RUNNING:
                policies.setdefault(row.deployment_id, []).append(row)
        for gone in set(self._histories) - set(policies):
            del self._histories[gone]
        self._pools = {key: pool for key, pool in self._pools.items() if key[0] in policies}
        for rows in policies.values():
            decided = self._evaluate(rows[0].deployment, rows, now)
            report.pools += len(rows)
            report.decisions += decided[0]
            report.changes += decided[1]
        for decision in follow(now):
            self._broadcast(decision.deployment, decision)
        PoolReading.objects.filter(at__lt=now - timedelta(seconds=READINGS_KEPT_S)).delete()
        report.seconds = time.perf_counter() - started
        return report

    def _evaluate(self, deployment: Deployment, rows: list[PoolPolicy], now: datetime
                  ) -> tuple[int, int]:
        at = now.timestamp()
        planned = {w.slot: w for w in deployment.workers.all()}
        processes = {p.slot: p for p in ManagedProcess.objects.filter(
            deployment=deployment, kind__in=ManagedProcess.PLANNED_KINDS)}
        history = self._read(deployment, planned, processes, at,
                             histograms=any(row.signal == "slo" for row in rows))
        rollout = Rollout.objects.filter(deployment=deployment,
                                         state__in=Rollout.ACTIVE_STATES).first()
        decisions: dict[str, _Evaluated] = {}
        for row in rows:
            slots = [slot for slot, w in planned.items() if w.role == row.role]
            if not slots:
                continue  # the plan's mode has no such pool now
            ready = sum(1 for s in slots if s in processes
                        and processes[s].state == ManagedProcess.State.READY)
            reading = read(row.signal, row.role, history, at, ready,
                           deployment.ttft_slo_ms / 1000, deployment.tpot_slo_ms / 1000)
            policy = policy_of(row)
            floor, window_name = scheduled_minimum(row.schedules, now)
            pool_state = self._pools.setdefault((deployment.pk, row.role), _Pool())
            asked = decide.asked_for(len(slots), reading.value, policy, ready)
            pool_state.history.append((at, asked))
            keep = max(policy.up_window_s, policy.down_window_s) + 2 * self.interval_s
            while pool_state.history and pool_state.history[0][0] < at - keep:
                pool_state.history.popleft()
            pool = decide.Pool(
                current=len(slots), starting=len(slots) - ready, floor=floor,
                last_change_at=self._last_change(deployment, row, pool_state),
                rollout=f"{rollout} is {rollout.state}" if rollout else "")
            decision = decide.decide(policy, pool, list(pool_state.history), at,
                                     resolution_s=self.interval_s)
            inputs = {**reading.inputs, "windows": {"up_s": row.up_window_s,
                                                    "down_s": row.down_window_s},
                      "scale_up_at": row.scale_up_at, "scale_down_at": row.scale_down_at}
            if floor:
                inputs["schedule"] = {"window": window_name, "min_instances": floor}
            decisions[row.role] = _Evaluated(row, decision, inputs, reading.value)
            self._send(deployment, reading_message(PoolReading.objects.create(
                deployment=deployment, role=row.role, at=now, value=reading.value, asked=asked,
                current=len(slots), ready=ready, scale_up_at=row.scale_up_at,
                scale_down_at=row.scale_down_at, mode=row.mode)))
        self._band(deployment, decisions)
        stored = changed = 0
        refused = False
        for pool in decisions.values():
            decision, slots, urls = self._act(deployment, pool.row, pool.decision, at)
            refused = refused or decision.reason == decide.CAPACITY
            if decision.would_change:
                self._store(deployment, pool.row, decision, pool.inputs, pool.value, slots, urls,
                            now)
                stored += 1
            changed += int(decision.action != "none" and pool.row.mode == PoolPolicy.Mode.ACTIVE)
        self._refused_fact(deployment, refused, now)
        return stored, changed

    @staticmethod
    def _band(deployment: Deployment, decisions: dict[str, _Evaluated]) -> None:
        if "prefill" not in decisions or "decode" not in decisions:
            return
        band = RatioBand.objects.filter(deployment=deployment).first()
        if band is None:
            return
        prefill, decode = decisions["prefill"], decisions["decode"]
        prefill.decision, decode.decision = decide.ratio_band(
            prefill.decision, decode.decision, band.min_ratio, band.max_ratio,
            prefill.row.max_instances, decode.row.max_instances)
        for pool in (prefill, decode):
            pool.inputs["ratio_band"] = {"min_ratio": band.min_ratio, "max_ratio": band.max_ratio}

    def _act(self, deployment: Deployment, row: PoolPolicy, decision: decide.Decision, at: float
             ) -> tuple[decide.Decision, list[str], list[str]]:
        if decision.action == "none":
            return decision, [], []
        pool_state = self._pools[(deployment.pk, row.role)]
        if row.mode == PoolPolicy.Mode.DRY_RUN:
            pool_state.dry_change_at = at
            return decision, [], []
        try:
            # The loop runs in a thread of its own, outside the supervisor's acting_as: the
            # change is the system's in the audit log, not the command that started it.
            with acting_as(AuditEntry.Actor.SYSTEM, LEASE_NAME):
                resized = resize(deployment, row.role, decision.target)
        except Refused as refused:
            log.warning("%s: %s pool not grown to %d: %s", deployment.name, row.role,
                        decision.target, refused)
            return (decide.Decision(decision.current, decision.asked, decision.desired,
                                    decision.current, "none", refused.reason,
                                    str(refused)[:500]), [], [])
        log.info("%s: %s pool %d -> %d (%s: %s)", deployment.name, row.role, decision.current,
                 decision.target, decision.reason, decision.detail)
        return decision, resized.slots, resized.urls

    def _last_change(self, deployment: Deployment, row: PoolPolicy, pool: _Pool) -> float | None:
        if row.mode == PoolPolicy.Mode.DRY_RUN:
            return pool.dry_change_at
        last = (ScalingDecision.objects.filter(deployment=deployment, role=row.role,
                                               dry_run=False)
                .exclude(action=ScalingDecision.Action.NONE).order_by("-at").first())
        return last.at.timestamp() if last else None

    # ---- storing ------------------------------------------------------------------------
    def _store(self, deployment: Deployment, row: PoolPolicy, decision: decide.Decision,
               inputs: dict[str, Any], value: float | None, slots: list[str], urls: list[str],
               now: datetime) -> None:
        dry_run = row.mode == PoolPolicy.Mode.DRY_RUN
        previous = (ScalingDecision.objects.filter(deployment=deployment, role=row.role)
                    .order_by("-at", "-pk").first())
        same = (previous is not None and decision.action == "none" and previous.action == "none"
                and previous.reason == decision.reason and previous.current == decision.current
                and previous.desired == decision.desired and previous.dry_run == dry_run
                and (now - previous.last_at).total_seconds() < 3 * self.interval_s)
        if same:
            previous.last_at, previous.evaluations = now, previous.evaluations + 1
            previous.value, previous.inputs, previous.detail = value, inputs, decision.detail
            previous.save(update_fields=["last_at", "evaluations", "value", "inputs", "detail",
                                          "changed"])
            saved = previous
        else:
            saved = ScalingDecision.objects.create(
                deployment=deployment, role=row.role, at=now, last_at=now, signal=row.signal,
                value=value, inputs=inputs, current=decision.current, desired=decision.desired,
                target=decision.target, action=decision.action, reason=decision.reason,
                detail=decision.detail[:500], dry_run=dry_run,
                slots=[{"slot": s, "url": u} for s, u in zip(slots, urls, strict=True)],
                progress={"decided_at": now.isoformat()} if slots else {})
        self._broadcast(deployment, saved)

    def _broadcast(self, deployment: Deployment, decision: ScalingDecision) -> None:
        self._send(deployment, decision_message(decision))

    @staticmethod
    def _send(deployment: Deployment, message: dict[str, Any]) -> None:
        # Without Redis only the console's own process reaches its sockets: its hub polls.
        if settings.REDIS_URL:
            async_to_sync(emit)(deployment_group(deployment.pk), message)

    def _refused_fact(self, deployment: Deployment, refused: bool, now: datetime) -> None:
        """1 while a pool's growth is refused for the node's capacity: the alert rule
        "scale-up refused" watches it. Written when it changes, and often enough for the
        evaluator to read it as fresh."""
        written = self._facts.get(deployment.pk)
        if written is not None and written[0] == refused and now - written[1] < FACT_REFRESH:
            return
        Fact.objects.update_or_create(deployment=deployment, series=REFUSED_FACT,
                                      defaults={"value": float(refused), "at": now})
        self._facts[deployment.pk] = (refused, now)

    # ---- inputs ---------------------------------------------------------------------------
    def _read(self, deployment: Deployment, planned: dict[str, Any],
              processes: dict[str, ManagedProcess], at: float, histograms: bool) -> History:
        """The deployment's recent snapshots; and, when a policy reads the SLO signal
        (``histograms``), the router's last scrape, parsed (tens of KB of text a tick)."""
        history = self._histories.setdefault(deployment.pk, History())
        rows = MetricSample.objects.filter(deployment=deployment, resolution=SECOND,
                                           id__gt=history.last_sample_id)
        if not history.last_sample_id:
            rows = rows.filter(created__gt=datetime.fromtimestamp(at - 150, tz=UTC))
        history.add_samples(((i, created.timestamp(), data) for i, created, data in
                             rows.order_by("id").values_list("id", "created", "data")),
                            planned, first_starts(planned, processes), first_ready(processes))
        router = processes.get("router")
        if histograms and router is not None and router.state == ManagedProcess.State.READY:
            scrape = ProcessScrape.objects.filter(process=router).first()
            if scrape is not None:
                history.add_scrape(scrape.scraped.timestamp(), scrape.text)
        history.trim(at)
        return history

    # ---- the thread -----------------------------------------------------------------------
    def _forget(self) -> None:
        self._held = False
        self._histories.clear()
        self._pools.clear()
        self._facts.clear()

    def _finish(self) -> None:
        if self._held:
            leases.release(LEASE_NAME, self.holder)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
