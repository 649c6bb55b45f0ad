"""The alert evaluator: every 5 s, every enabled rule of every running deployment.

One code path for ``make up`` and scaled-out consoles alike: each supervisor runs the loop, and
the one holding the database lease (``EvaluatorLease``) evaluates while the others wait for it
to lapse, so no alert is notified twice. A tick reads the 1 s snapshots the collector stored
since the last tick (kept in memory for the longest window), adds the facts that no process
exports, steps each rule instance's state machine (console/alerts/rule_states.py), and stores
what changed: alert rows, their history, silencing and inhibition, and the notifications,
which the delivery worker sends from its own thread, so that a hanging receiver never delays
the next tick.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.alerts import leases, rule_states
from console.alerts import series as catalog
from console.alerts.delivery import Notice, enqueue
from console.alerts.facts import foreign_ports, missing_families
from console.alerts.models import (
    Alert,
    AlertEvent,
    AlertRule,
    AlertState,
    Fact,
)
from console.alerts.muting import muted_by
from console.alerts.snapshots import expected, first_ready, first_starts, frame, grouped
from console.alerts.streams import alert_messages
from console.deployments.models import Deployment
from console.fleet import port_holders
from console.fleet.agent_liveness import NodeMonitor
from console.fleet.models import NodeAgent
from console.fleet.services import local_node
from console.live.groups import emit
from console.live.models import MetricSample
from console.live.periodic import Periodic
from console.quality.models import GateResult
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.alerts")

TICK_S = 5.0
LEASE_NAME = "alerts-evaluator"
# Three missed ticks: a holder that stalls this long is taken over.
LEASE_S = 15.0
MIN_HISTORY_S = 60.0
SECOND = MetricSample.Resolution.SECOND
FACT_REFRESH = timedelta(seconds=15)
TICK_FACTS = ("deployment.gate_failed", "deployment.foreign_ports", "deployment.metrics_missing",
              "deployment.scale_refused", "deployment.node_down")
# Facts another loop writes (the autoscaler): read as stored, 0 once older than this.
STORED_FACTS = ("deployment.scale_refused",)
STORED_FACT_FRESH = timedelta(seconds=60)


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def render_summary(template: str, values: dict[str, Any]) -> str:
    """The rule's summary with its placeholders filled; an unknown one stays as written."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), m.group(0))), template)


@dataclass
class _Instance:
    """One rule instance the evaluator keeps: its state machine and its row, once it has one."""

    labels: dict[str, str]
    state: rule_states.InstanceState
    alert_id: int | None = None
    notified_at: datetime | None = None


@dataclass
class _DeploymentCache:
    frames: deque[catalog.Frame] = field(default_factory=deque)
    fact_frames: deque[catalog.Frame] = field(default_factory=deque)
    last_sample_id: int = 0
    notes: dict[str, str] = field(default_factory=dict)
    facts_written: dict[str, tuple[float, datetime]] = field(default_factory=dict)


@dataclass
class TickReport:
    evaluated: bool
    deployments: int = 0
    rules: int = 0
    instances: int = 0
    transitions: int = 0
    notices: int = 0
    seconds: float = 0.0


class Evaluator:
    def __init__(self, holder: str | None = None, interval_s: float = TICK_S,
                 lease_s: float = LEASE_S, nodes: NodeMonitor | None = None) -> None:
        """``nodes``: the judge of node agents' heartbeats (settings' Redis and grace)."""
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.interval_s = interval_s
        self.lease_s = lease_s
        self._held = False
        self._local_memory = 0
        self._caches: dict[int, _DeploymentCache] = {}
        self._instances: dict[tuple[int, str], _Instance] = {}
        self._nodes = nodes or NodeMonitor()
        self._loop = Periodic("alert-evaluator", interval_s, self._step, log,
                              "evaluating alerts failed; retrying", self._finish)

    # ---- the lease -------------------------------------------------------------------------
    def hold_lease(self, now: datetime) -> bool:
        """Take or renew the lease; False while another evaluator holds it."""
        if not leases.hold(LEASE_NAME, self.holder, self.lease_s, now):
            self._release_memory()
            return False
        if not self._held:
            # Another evaluator may have changed every alert since this one last held it.
            self._release_memory()
            self._load_instances()
        self._held = True
        return True

    def release_lease(self) -> None:
        leases.release(LEASE_NAME, self.holder)
        self._release_memory()

    def _release_memory(self) -> None:
        self._held = False
        self._caches.clear()
        self._instances.clear()
        # A judge that takes over gives every node a whole grace (console/fleet/agent_liveness.py).
        self._nodes.watches.clear()

    def _load_instances(self) -> None:
        for alert in Alert.objects.all():
            self._instances[(alert.rule_id, alert.fingerprint)] = _Instance(
                alert.labels, rule_states.InstanceState(
                    state=alert.state, value=alert.value,
                    active_since=_ts(alert.active_since), fired_at=_ts(alert.fired_at),
                    last_true_at=_ts(alert.last_true_at)), alert.pk, alert.notified_at)

    # ---- one tick --------------------------------------------------------------------------
    def tick(self, now: datetime | None = None) -> TickReport:
        started = time.perf_counter()
        now = now or timezone.now()
        if not self.hold_lease(now):
            return TickReport(evaluated=False)
        report = TickReport(evaluated=True)
        # Node agents' liveness first: this tick's node_down facts read it.
        self._nodes.step()
        self._local_memory = local_node().memory_bytes
        rules_by_deployment: dict[int, list[AlertRule]] = {}
        for rule in AlertRule.objects.filter(enabled=True).select_related("deployment"):
            rules_by_deployment.setdefault(rule.deployment_id, []).append(rule)
        running = {d.pk: d for d in Deployment.objects.filter(
            desired_state=Deployment.DesiredState.RUNNING).prefetch_related("workers__node")}
        listeners = port_holders.listeners() if any(
            r.series == "deployment.foreign_ports" for d in running
            for r in rules_by_deployment.get(d, [])) else {}
        changed: list[tuple[Alert, rule_states.Transition]] = []
        active: list[Alert] = []
        for deployment_id, rules in rules_by_deployment.items():
            deployment = running.get(deployment_id)
            if deployment is None:
                changed += self._stand_down(rules, now)
                self._caches.pop(deployment_id, None)
                continue
            report.deployments += 1
            report.rules += len(rules)
            stepped = self._evaluate_deployment(deployment, rules, now, listeners)
            report.instances += stepped.instances
            changed += stepped.changed
            active += stepped.active
        for deployment_id in set(self._caches) - set(rules_by_deployment):
            del self._caches[deployment_id]
        notices = self._store(changed, active, now)
        report.transitions, report.notices = len(changed), len(notices)
        report.seconds = time.perf_counter() - started
        return report

    @dataclass
    class _Stepped:
        instances: int = 0
        changed: list[tuple[Alert, rule_states.Transition]] = field(default_factory=list)
        active: list[Alert] = field(default_factory=list)

    def _evaluate_deployment(self, deployment: Deployment, rules: list[AlertRule],
                             now: datetime, listeners: dict[int, set[int]]) -> _Stepped:
        at = now.timestamp()
        longest = max([MIN_HISTORY_S, *(float(rule.window_s) for rule in rules)])
        processes = {p.slot: p for p in ManagedProcess.objects.filter(
            deployment=deployment, kind__in=ManagedProcess.PLANNED_KINDS)}
        planned = {w.slot: w for w in deployment.workers.all()}
        starting = first_starts(planned, processes)
        # Stopped on purpose (a rollout's retired blue, a removed instance): its silence is no
        # outage, and an alert it had ends (an instance nothing evaluates stayed firing).
        retired = {slot for slot, process in processes.items() if slot not in planned
                   and process.state in (ManagedProcess.State.STOPPING,
                                         ManagedProcess.State.STOPPED)}
        cache = self._caches.setdefault(deployment.pk, _DeploymentCache())
        self._read_samples(deployment, cache, planned, starting, first_ready(processes),
                           at - longest)
        self._tick_facts(deployment, rules, cache, processes, listeners, now)
        snapshots, facts = list(cache.frames), list(cache.fact_frames)
        snapshot_times, fact_times = [f.at for f in snapshots], [f.at for f in facts]
        stepped = self._Stepped()
        for rule in rules:
            try:
                definition = catalog.get(rule.series)
                spec = rule_states.RuleSpec(
                    comparison=rule.comparison, threshold=rule.threshold, for_s=rule.for_s,
                    keep_firing_for_s=rule.keep_firing_for_s, min_count=rule.min_count,
                    nodata=rule.nodata)
            except ValueError:
                log.exception("rule %d (%s) cannot be evaluated", rule.pk, rule.name)
                continue
            # Only the rule's window: the cache holds the longest window of all the rules.
            since = at - rule.window_s
            frames = (snapshots[bisect.bisect_right(snapshot_times, since):]
                      if definition.per_process or definition.name not in TICK_FACTS
                      else facts[bisect.bisect_right(fact_times, since):])
            groups = grouped(definition, catalog.instance_points(definition, frames, rule.role),
                              rule.scope)
            for key in expected(definition, rule, planned, starting):
                groups.setdefault(key, [])
            for key, points in groups.items():
                if key[1] in starting:
                    continue  # first start: not down, not missing data, just not up yet
                if key[1] in retired:
                    stepped.changed += self._retire(rule, deployment, key, now)
                    continue
                if definition.is_ratio:
                    value, count = rule_states.aggregate_ratio(points, rule.aggregation,
                                                               rule.window_s, at)
                    # absent must see an empty window, whatever the count.
                    count_or_none = None if rule.aggregation == "absent" else count
                else:
                    value = rule_states.aggregate(points, rule.aggregation, rule.window_s, at)
                    count_or_none = None
                labels = self._labels(rule, deployment, key)
                instance = self._instances.setdefault(
                    (rule.pk, fingerprint(labels)),
                    _Instance(labels, rule_states.InstanceState()))
                stepped.instances += 1
                _state, transition = rule_states.step(spec, instance.state, value, at,
                                                      count_or_none)
                if transition is None and instance.state.state == AlertState.INACTIVE:
                    continue
                alert = self._alert_row(rule, deployment, instance, key, cache, now)
                if transition is not None:
                    stepped.changed.append((alert, transition))
                elif instance.state.state != AlertState.INACTIVE:
                    stepped.active.append(alert)
        return stepped

    # ---- inputs ----------------------------------------------------------------------------
    def _read_samples(self, deployment: Deployment, cache: _DeploymentCache,
                      planned: dict[str, Any], starting: set[str],
                      ready_since: dict[str, float], since: float) -> None:
        rows = MetricSample.objects.filter(deployment=deployment, resolution=SECOND,
                                           id__gt=cache.last_sample_id)
        if not cache.last_sample_id:
            rows = rows.filter(created__gt=datetime.fromtimestamp(since, tz=UTC))
        memory = {slot: worker.node.memory_bytes for slot, worker in planned.items()}
        memory["router"] = self._local_memory
        previous = cache.frames[-1] if cache.frames else None
        for sample_id, created, data in rows.order_by("id").values_list("id", "created", "data"):
            cache.last_sample_id = sample_id
            snapshot = frame(created.timestamp(), data.get("processes", {}), planned, starting,
                             memory, previous, ready_since)
            cache.frames.append(snapshot)
            previous = snapshot
        while cache.frames and cache.frames[0].at <= since:
            cache.frames.popleft()
        while cache.fact_frames and cache.fact_frames[0].at <= since:
            cache.fact_frames.popleft()

    def _tick_facts(self, deployment: Deployment, rules: list[AlertRule], cache: _DeploymentCache,
                    processes: dict[str, ManagedProcess], listeners: dict[int, set[int]],
                    now: datetime) -> None:
        wanted = {rule.series for rule in rules} & set(TICK_FACTS)
        if not wanted:
            return
        facts: dict[str, float] = {}
        if "deployment.gate_failed" in wanted:
            latest = GateResult.objects.filter(deployment=deployment,
                                               state__in=GateResult.DONE_STATES).first()
            facts["deployment.gate_failed"] = float(
                latest is not None and latest.state == GateResult.State.FAILED)
            cache.notes["deployment.gate_failed"] = "; ".join(latest.reasons) if latest else ""
        if "deployment.foreign_ports" in wanted:
            facts["deployment.foreign_ports"], cache.notes["deployment.foreign_ports"] = (
                foreign_ports(deployment, processes, listeners))
        if "deployment.node_down" in wanted:
            down = sorted(NodeAgent.objects.filter(
                node__workers__deployment=deployment, state=NodeAgent.State.DOWN,
            ).values_list("node__name", flat=True).distinct())
            facts["deployment.node_down"] = float(len(down))
            cache.notes["deployment.node_down"] = ", ".join(down)
        if "deployment.metrics_missing" in wanted:
            facts["deployment.metrics_missing"], cache.notes["deployment.metrics_missing"] = (
                missing_families(rules, processes, now))
        for name in wanted & set(STORED_FACTS):
            stored = Fact.objects.filter(deployment=deployment, series=name,
                                         at__gte=now - STORED_FACT_FRESH).first()
            facts[name] = stored.value if stored else 0.0
        cache.fact_frames.append(catalog.Frame(now.timestamp(), {}, facts))
        for name, value in facts.items():
            if name in STORED_FACTS:
                continue  # its writer keeps it
            written = cache.facts_written.get(name)
            # Rewritten when it changes, and often enough for the export to call it fresh.
            if written is None or written[0] != value or now - written[1] >= FACT_REFRESH:
                Fact.objects.update_or_create(deployment=deployment, series=name,
                                              defaults={"value": value, "at": now})
                cache.facts_written[name] = (value, now)

    # ---- alert rows ------------------------------------------------------------------------
    @staticmethod
    def _labels(rule: AlertRule, deployment: Deployment, key: catalog.Instance) -> dict[str, str]:
        labels = {str(k): str(v) for k, v in rule.labels.items()}
        labels.update(alertname=rule.alertname, deployment=deployment.name,
                      severity=rule.severity, series=rule.series)
        role, slot = key
        if role:
            labels["role"] = role
        if slot:
            labels["process"] = slot
        if rule.key:
            labels["rule"] = rule.key
        return labels

    def _alert_row(self, rule: AlertRule, deployment: Deployment, instance: _Instance,
                   key: catalog.Instance, cache: _DeploymentCache, now: datetime) -> Alert:
        state = instance.state
        values = {"deployment": deployment.name, "role": key[0] or "all roles",
                  "instance": key[1] or deployment.name, "series": rule.series,
                  "threshold": _number(rule.threshold),
                  "value": "no data" if state.value is None else _number(state.value)}
        annotations = {"summary": render_summary(rule.summary or "{series} {value}", values)}
        if rule.runbook_url:
            annotations["runbook_url"] = rule.runbook_url
        if cache.notes.get(rule.series):
            annotations["description"] = cache.notes[rule.series]
        if state.state == AlertState.NODATA:
            annotations["state"] = "nodata"
        fields = {
            "state": state.state, "value": state.value, "annotations": annotations,
            "active_since": _dt(state.active_since), "fired_at": _dt(state.fired_at),
            "last_true_at": _dt(state.last_true_at), "evaluated_at": now,
        }
        if instance.alert_id is None:
            alert, _created = Alert.objects.get_or_create(
                rule=rule, fingerprint=fingerprint(instance.labels),
                defaults={"deployment": deployment, "labels": instance.labels, **fields})
            instance.alert_id = alert.pk
        else:
            alert = Alert(pk=instance.alert_id, rule=rule, deployment=deployment,
                          fingerprint=fingerprint(instance.labels), labels=instance.labels,
                          notified_at=instance.notified_at)
        for name, value in fields.items():
            setattr(alert, name, value)
        return alert

    def _retire(self, rule: AlertRule, deployment: Deployment, key: catalog.Instance,
                now: datetime) -> list[tuple[Alert, rule_states.Transition]]:
        """The alert of an instance whose process was stopped on purpose, ended (resolved, if
        it was notified); nothing when it had none."""
        fingerprinted = fingerprint(self._labels(rule, deployment, key))
        instance = self._instances.get((rule.pk, fingerprinted))
        if instance is None or instance.state.state == AlertState.INACTIVE:
            return []
        alert = Alert.objects.filter(rule=rule, fingerprint=fingerprinted).first()
        instance.state.state, instance.state.value = AlertState.INACTIVE, None
        if alert is None:
            return []
        transition = rule_states.Transition(alert.state, AlertState.INACTIVE,
                                            now.timestamp(), None)
        alert.state, alert.value, alert.evaluated_at = AlertState.INACTIVE, None, now
        return [(alert, transition)]

    def _stand_down(self, rules: list[AlertRule], now: datetime
                    ) -> list[tuple[Alert, rule_states.Transition]]:
        """A deployment that was stopped: its alerts end (resolved, if they were notified)."""
        ended = []
        for alert in Alert.objects.filter(rule__in=rules).exclude(state=AlertState.INACTIVE):
            instance = self._instances.get((alert.rule_id, alert.fingerprint))
            transition = rule_states.Transition(alert.state, AlertState.INACTIVE,
                                                now.timestamp(), None)
            if instance is not None:
                instance.state.state = AlertState.INACTIVE
                instance.state.value = None
            alert.state, alert.value, alert.evaluated_at = AlertState.INACTIVE, None, now
            ended.append((alert, transition))
        return ended

    # ---- storing ---------------------------------------------------------------------------
    def _store(self, changed: list[tuple[Alert, rule_states.Transition]], active: list[Alert],
               now: datetime) -> list[Notice]:
        if not changed and not active:
            return []
        rows = [alert for alert, _t in changed] + active
        muted = muted_by(rows, now)
        notices = []
        events = []
        for alert, transition in changed:
            if transition.resolved:
                alert.resolved_at = now
            why = muted.get(alert.pk, "")
            events.append(AlertEvent(alert_id=alert.pk, deployment_id=alert.deployment_id,
                                     at=now, from_state=transition.from_state,
                                     to_state=transition.to_state, value=transition.value,
                                     muted_by=why))
            if transition.resolved:
                # An episode nobody was told about ends as quietly as it began.
                quiet = bool(why) or alert.notified_at is None
                notices.append(Notice(alert=alert, status="resolved", muted=quiet))
                alert.notified_at = None
            elif (transition.to_state in rule_states.ALERTING_STATES
                  and transition.from_state not in rule_states.ALERTING_STATES):
                notices.append(Notice(alert=alert, status="firing", muted=bool(why)))
                alert.notified_at = None if why else now
        for alert, _transition in changed:
            instance = self._instances.get((alert.rule_id, alert.fingerprint))
            if instance is not None:
                instance.notified_at = alert.notified_at
        with transaction.atomic():
            Alert.objects.bulk_update(rows, ["state", "value", "annotations", "active_since",
                                             "fired_at", "last_true_at", "resolved_at",
                                             "evaluated_at", "notified_at"])
            created = AlertEvent.objects.bulk_create(events)
            if notices:
                enqueue(notices, now)
        if settings.REDIS_URL and created:
            # Shared channel layer: broadcast right after storing; without Redis the console's
            # hub polls the stored events (console/live/hub.py's sources).
            for group, payload in alert_messages(created):
                async_to_sync(emit)(group, payload)
        return notices

    # ---- the thread ------------------------------------------------------------------------
    def _step(self) -> None:
        report = self.tick()
        if report.evaluated and report.seconds > self.interval_s:
            log.warning("an alert evaluation took %.1f s, longer than its %.0f s interval",
                        report.seconds, self.interval_s)

    def _finish(self) -> None:
        if self._held:
            self.release_lease()

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()


# ---- helpers -------------------------------------------------------------------------------
def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC)


def _number(value: float) -> str:
    return f"{value:.4g}"
