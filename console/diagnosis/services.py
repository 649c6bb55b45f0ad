"""Gathering a deployment's observations from the console's tables, and the report the page,
the API and ``manage.py doctor`` show: the rules themselves are pure (examination.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from console.alerts.models import Alert, AlertState
from console.alerts.symptom_links import symptom_of
from console.checks.suite import run_checks
from console.deployments.models import Deployment
from console.diagnosis import log_patterns
from console.diagnosis.examination import examine, worst
from console.diagnosis.observations import (
    AlertFact,
    CheckFact,
    GateFact,
    LogHit,
    Observations,
    Plan,
    PlannedWorker,
    ProcessFact,
    Sample,
)
from console.diagnosis.symptoms import Diagnosis
from console.live.models import LogLine, MetricSample
from console.quality.services import latest_gate
from console.supervisor.models import ManagedProcess

# The collector keeps 1 s samples for 15 minutes; the rules look at the last five.
SAMPLES_FOR = timedelta(minutes=5)
# Log lines this recent count; an older failure that no longer recurs is history.
LOGS_FOR = timedelta(minutes=30)
# The newest matching lines kept per process and kind: enough to show, not to flood.
HITS_PER_KIND = 3
MAX_LINES = 500
# Plan fields that live in the pools' sections of the plan form rather than as one field.
POOL_FIELDS = frozenset({"variant", "ports", "instances", "cpu_cores"})


def gather(deployment: Deployment, now: datetime | None = None) -> Observations:
    now = now or timezone.now()
    processes = list(ManagedProcess.objects.filter(
        deployment=deployment, kind__in=ManagedProcess.PLANNED_KINDS).select_related("node"))
    return Observations(
        plan=_plan(deployment), now=now, processes=tuple(_process(p) for p in processes),
        samples=_samples(deployment, now), logs=_log_hits(processes, now),
        checks=_checks(deployment), alerts=_alerts(deployment), gate=_gate(deployment),
        metrics_url=reverse("deployment-dashboard", args=[deployment.name]))


def report(deployment: Deployment, now: datetime | None = None) -> dict[str, Any]:
    """The JSON the API returns and the page and the command render."""
    obs = gather(deployment, now)
    diagnoses = examine(obs)
    return {
        "deployment": deployment.pk,
        "name": deployment.name,
        "evaluated_at": obs.now.isoformat(),
        "state": str(worst(diagnoses)),
        "symptoms": [_linked(deployment, d) for d in diagnoses],
    }


def fix_url(deployment: Deployment, target: str) -> str:
    """Where a fix is applied: a plan field on the plan form, or a page's action."""
    kind, _, name = target.partition(":")
    if kind == "plan":
        anchor = "plan-form" if name in POOL_FIELDS else f"id_{name}"
        return f"{reverse('plan-edit', args=[deployment.name])}#{anchor}"
    if kind != "page":
        return ""  # a setting of the console's environment: no page changes it
    detail = reverse("deployment-detail", args=[deployment.name])
    pages = {
        "processes": f"{detail}#processes", "start": detail, "gate": f"{detail}#gate",
        "autoscaling": reverse("autoscaling", args=[deployment.name]),
        "keys": reverse("keys"), "nodes": reverse("fleet"),
    }
    return pages[name]


def _linked(deployment: Deployment, diagnosis: Diagnosis) -> dict[str, Any]:
    data = diagnosis.as_dict()
    for cause in data["causes"]:
        for fix in cause["fixes"]:
            fix["url"] = fix_url(deployment, fix["target"])
    return data


# ---- the tables, read into observations -------------------------------------------------------
def _plan(deployment: Deployment) -> Plan:
    workers = tuple(PlannedWorker(
        slot=w.slot, role=w.role, variant=w.variant.name, path=w.variant.path,
        quantized=w.variant.is_quantized)
        for w in deployment.workers.select_related("variant"))
    return Plan(
        name=deployment.name, mode=deployment.mode,
        running=deployment.desired_state == Deployment.DesiredState.RUNNING,
        kv_channel=deployment.kv_channel, kv_load_failure=deployment.kv_load_failure,
        max_model_len=deployment.max_model_len, concurrency=max(1, deployment.concurrency),
        kv_cache_gib=deployment.kv_cache_gib, ttft_slo_s=deployment.ttft_slo_ms / 1000,
        tpot_slo_s=deployment.tpot_slo_ms / 1000, pd_policy=deployment.pd_policy,
        decode_policy=deployment.decode_policy, prefill_policy=deployment.prefill_policy,
        workers=workers)


def _process(process: ManagedProcess) -> ProcessFact:
    return ProcessFact(
        slot=process.slot, role=process.role, state=process.state, restarts=process.restarts,
        exit_code=process.exit_code, last_error=process.last_error,
        started_at=process.started_at, ready_at=process.ready_at, degraded=process.degraded,
        log_url=reverse("process-log", args=[process.pk]),
        node_memory_bytes=process.node.memory_bytes if process.node_id else None)


def _samples(deployment: Deployment, now: datetime) -> tuple[Sample, ...]:
    rows = MetricSample.objects.filter(
        deployment=deployment, resolution=MetricSample.Resolution.SECOND,
        created__gte=now - SAMPLES_FOR, created__lte=now).order_by("created")
    return tuple(Sample(row.created, dict(row.data.get("processes", {}))) for row in rows)


def _log_hits(processes: list[ManagedProcess], now: datetime) -> tuple[LogHit, ...]:
    matches = Q()
    for needle in log_patterns.NEEDLES:
        matches |= Q(text__icontains=needle)
    slots = {p.pk: p.slot for p in processes}
    lines = (LogLine.objects.filter(process_id__in=list(slots), created__gte=now - LOGS_FOR)
             .filter(matches).order_by("-created", "-seq")[:MAX_LINES])
    kept: dict[tuple[int, str], int] = {}
    hits = []
    for line in lines:
        kind = log_patterns.classify(line.text)
        if kind is None:
            continue
        count = kept.get((line.process_id, kind), 0)
        if count >= HITS_PER_KIND:
            continue
        kept[(line.process_id, kind)] = count + 1
        url = (f"{reverse('process-logs', args=[line.process_id])}"
               f"?after={max(0, line.seq - 5)}&limit=20")
        hits.append(LogHit(slots[line.process_id], line.seq, line.created, line.text, kind, url))
    return tuple(reversed(hits))


def _checks(deployment: Deployment) -> tuple[CheckFact, ...]:
    return tuple(CheckFact(r.id, str(r.severity), r.message, r.hint)
                 for r in run_checks(deployment).results)


def _alerts(deployment: Deployment) -> tuple[AlertFact, ...]:
    firing = Alert.objects.filter(deployment=deployment, state=AlertState.FIRING).order_by("pk")
    return tuple(AlertFact(
        name=alert.labels.get("alertname", ""),
        kind=alert.labels.get("rule") or alert.labels.get("series", ""),
        symptom=symptom_of(alert.labels),
        state=alert.state, since=alert.fired_at or alert.active_since,
        summary=alert.annotations.get("summary", ""),
        url=reverse("alert-detail", args=[alert.pk])) for alert in firing)


def _gate(deployment: Deployment) -> GateFact | None:
    gate = latest_gate(deployment)
    if gate is None:
        return None
    return GateFact(state=gate.state, reasons=tuple(gate.reasons), finished_at=gate.finished_at,
                    url=f"{reverse('deployment-detail', args=[deployment.name])}#gate")
