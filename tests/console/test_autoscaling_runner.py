"""The autoscaler over stored state: a running plan of tiny registered models whose processes
are READY rows (no vLLM runs), the collector's 1 s snapshots stored as MetricSample rows, and
``Autoscaler.tick(now)`` at successive times. It grows and shrinks the plan, records each
decision (and extends a repeated hold), leaves the plan alone in a dry run, during a rollout and
when the node lacks the memory, and then says so through the alert evaluator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from console.alerts.evaluation import Evaluator
from console.alerts.models import Alert, AlertState, Fact
from console.audit.models import AuditEntry
from console.autoscaling import decide
from console.autoscaling.actions import resize
from console.autoscaling.models import PoolPolicy, PoolReading, RatioBand, ScalingDecision
from console.autoscaling.runner import REFUSED_FACT, Autoscaler
from console.catalog.models import Variant
from console.checks import memory
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import GIB, Node
from console.fleet.services import local_node
from console.live.models import MetricSample, ProcessScrape
from console.rollouts import revisions, services
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess
from tests.console.tiny_models import make_plan, make_startable, register, running

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
INTERVAL_S = 5
READY = ManagedProcess.State.READY
# In flight on decode-0 when loaded: three times the policy's scale-up level.
HIGH = 12


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    """One prefill and one decode of a tiny model, running, each process ready before T0, on
    a local node with room (cores and memory) for more instances than the machine running the
    tests may have."""
    Node.objects.filter(pk=local_node().pk).update(cpu_ids=list(range(8)),
                                                   memory_bytes=64 * GIB)
    deployment = running(make_startable(make_plan(tmp_path)))
    for worker in deployment.workers.all():
        _ready(deployment, worker.slot, worker.role, worker.port, T0 - timedelta(minutes=5))
    _ready(deployment, "router", "router", deployment.router_port, T0 - timedelta(minutes=5))
    return deployment


def _ready(deployment: Deployment, slot: str, role: str, port: int, at: datetime) -> None:
    ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=port,
                                  state=READY, ready_at=at, log_path="/dev/null")


def _policy(deployment: Deployment, **fields: Any) -> PoolPolicy:
    values: dict[str, Any] = {
        "role": "decode", "mode": PoolPolicy.Mode.ACTIVE, "signal": "concurrency",
        "min_instances": 1, "max_instances": 3, "scale_up_at": 4.0, "scale_down_at": 1.0,
        "up_window_s": 10, "down_window_s": 30, "max_step": 1, "cooldown_s": 20, **fields}
    return PoolPolicy.objects.create(deployment=deployment, **values)


def _load(deployment: Deployment, since: datetime, until: datetime, per_decode: int,
          per_prefill: int = 0) -> None:
    """The collector's 1 s snapshots over (since, until]: ``per_decode`` requests in flight at
    the router on, and waiting in the engine of, each decode worker of the plan; and
    ``per_prefill`` waiting in each prefill worker's."""
    decode = list(deployment.workers.filter(role="decode").order_by("index"))
    at = since + timedelta(seconds=1)
    while at <= until:
        processes: dict[str, Any] = {
            w.slot: {"role": w.role, "up": 1, "waiting": per_prefill if w.role == "prefill"
                     else per_decode} for w in deployment.workers.all()}
        processes["router"] = {"role": "router", "up": 1,
                               "in_flight": {"decode": {w.url: per_decode for w in decode}}}
        MetricSample.objects.create(deployment=deployment,
                                    resolution=MetricSample.Resolution.SECOND, created=at,
                                    data={"processes": processes})
        at += timedelta(seconds=1)


def _tick(autoscaler: Autoscaler, seconds: float) -> None:
    report = autoscaler.tick(now=T0 + timedelta(seconds=seconds))
    assert report.evaluated


def _layout(deployment: Deployment) -> list[tuple[str, int, int | None, str]]:
    return list(WorkerPlan.objects.filter(deployment=deployment).order_by("role", "index")
                .values_list("role", "port", "side_channel_port", "cpu_cores"))


def _decisions(deployment: Deployment) -> list[ScalingDecision]:
    return list(ScalingDecision.objects.filter(deployment=deployment).order_by("at", "pk"))


def _grow(deployment: Deployment, autoscaler: Autoscaler) -> list[ScalingDecision]:
    """High load from before T0 and the ticks that cover the 10 s up window."""
    _load(deployment, T0 - timedelta(seconds=20), T0 + timedelta(seconds=10), HIGH)
    _tick(autoscaler, 5)
    _tick(autoscaler, 10)
    return _decisions(deployment)


@pytest.mark.parametrize("signal", ["concurrency", "queue"])
def test_high_load_over_the_up_window_adds_a_decode_instance(plan: Deployment,
                                                             signal: str) -> None:
    _policy(plan, signal=signal)
    before = _layout(plan)
    waiting, grown = _grow(plan, Autoscaler(interval_s=INTERVAL_S))
    # The first evaluation cannot cover the window yet; the second does.
    assert (waiting.reason, waiting.action, waiting.target) == (decide.STABILIZING, "none", 1)
    assert (grown.action, grown.reason, grown.current, grown.target) == ("up", decide.CHANGED,
                                                                          1, 2)
    assert grown.desired == 3  # 12 in flight on one instance, 4 each
    assert grown.value == HIGH and not grown.dry_run
    assert grown.inputs["windows"] == {"up_s": 10, "down_s": 30}
    decode_1 = WorkerPlan.objects.get(deployment=plan, role="decode", index=1)
    assert grown.slots == [{"slot": "decode-1", "url": decode_1.url}]
    # The new instance has a port and side-channel port of its own and a free core; the plan's
    # other instances are as they were.
    after = _layout(plan)
    assert [row for row in after if row[0] != "decode" or row[1] != decode_1.port] == before
    taken = {p for _role, port, side, _cores in before for p in (port, side)}
    assert decode_1.port not in taken | {plan.router_port}
    assert decode_1.side_channel_port not in taken | {plan.router_port, decode_1.port}
    assert decode_1.cpu_cores not in {cores for *_, cores in before}
    entry = AuditEntry.objects.get(action="deployment.autoscale")
    assert entry.changes == {"decode_instances": [1, 2]}
    # The autoscaler's doing, not a command's or a user's.
    assert entry.actor == AuditEntry.Actor.SYSTEM
    # Each evaluation is a reading for the page's chart, whatever was decided.
    assert list(PoolReading.objects.filter(deployment=plan).values_list("asked", "current")) == [
        (3, 1), (3, 1)]


def test_a_dry_run_records_the_same_decision_and_changes_nothing(plan: Deployment) -> None:
    _policy(plan, mode=PoolPolicy.Mode.DRY_RUN)
    before = _layout(plan)
    waiting, grown = _grow(plan, Autoscaler(interval_s=INTERVAL_S))
    assert (waiting.reason, waiting.dry_run) == (decide.STABILIZING, True)
    assert (grown.action, grown.reason, grown.current, grown.desired, grown.target) == (
        "up", decide.CHANGED, 1, 3, 2)
    assert grown.dry_run and grown.slots == []
    assert _layout(plan) == before
    assert not AuditEntry.objects.filter(action="deployment.autoscale").exists()


def test_a_node_without_the_memory_refuses_and_the_alert_fires(plan: Deployment) -> None:
    _policy(plan)
    node = local_node()
    # Room for the two instances planned, not for a third.
    workers = list(plan.workers.select_related("variant"))
    each = max(memory.estimate(plan, w).total for w in workers)
    usable = sum(memory.estimate(plan, w).total for w in workers) + each // 2
    Node.objects.filter(pk=node.pk).update(memory_bytes=int(usable / (1 - memory.HEADROOM)))
    before = _layout(plan)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    _waiting, refused = _grow(plan, autoscaler)
    assert (refused.action, refused.reason, refused.current, refused.target) == (
        "none", decide.CAPACITY, 1, 1)
    assert "decode-1" in refused.detail and "lacks memory" in refused.detail
    assert _layout(plan) == before
    assert not AuditEntry.objects.filter(action="deployment.autoscale").exists()
    assert Fact.objects.get(deployment=plan, series=REFUSED_FACT).value == 1.0
    # Refused again on the next evaluation: the same row, one more evaluation.
    _load(plan, T0 + timedelta(seconds=10), T0 + timedelta(seconds=15), HIGH)
    _tick(autoscaler, 15)
    assert _decisions(plan)[-1].pk == refused.pk
    refused.refresh_from_db()
    assert refused.evaluations == 2
    Evaluator(holder="alerts").tick(T0 + timedelta(seconds=16))
    alert = Alert.objects.get(rule__deployment=plan, rule__key="scale_refused")
    assert alert.state == AlertState.FIRING
    # Room again (another node size, say): the next evaluation grows and the fact clears.
    Node.objects.filter(pk=node.pk).update(memory_bytes=64 * GIB)
    _load(plan, T0 + timedelta(seconds=15), T0 + timedelta(seconds=20), HIGH)
    _tick(autoscaler, 20)
    assert _decisions(plan)[-1].action == "up"
    assert Fact.objects.get(deployment=plan, series=REFUSED_FACT).value == 0.0


def test_an_active_rollout_holds_the_pool_in_one_row(plan: Deployment, tmp_path: Path) -> None:
    _policy(plan)
    revisions.ensure_live(plan)
    green = register(plan.base_model, tmp_path, "green")
    draft, _ = revisions.create_draft(plan, {"gate_mode": "off"},
                                      {"prefill": green, "decode": green}, None)
    rollout = services.start(plan, draft, "canary", None,
                             steps=[{"weight": 10, "hold_s": 0}, {"weight": 100, "hold_s": 0}],
                             scale_down_delay_s=0)
    assert rollout.state in Rollout.ACTIVE_STATES
    before = _layout(plan)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    _load(plan, T0 - timedelta(seconds=20), T0 + timedelta(seconds=30), HIGH)
    ticks = [5, 10, 15, 20, 25, 30]
    for seconds in ticks:
        _tick(autoscaler, seconds)
    waiting, held = _decisions(plan)
    assert waiting.reason == decide.STABILIZING
    assert (held.reason, held.action, held.current, held.desired, held.target) == (
        decide.ROLLOUT, "none", 1, 3, 1)
    assert str(rollout) in held.detail
    # One row for the hold, however many evaluations made it.
    assert held.evaluations == len(ticks) - 1
    assert (held.at, held.last_at) == (T0 + timedelta(seconds=ticks[1]),
                                       T0 + timedelta(seconds=ticks[-1]))
    assert _layout(plan) == before
    assert Variant.objects.filter(name="green").exists()


def test_low_load_after_the_window_and_cooldown_removes_the_newest_instance(
        plan: Deployment) -> None:
    # A cooldown longer than the down window: the shrink waits for it.
    policy = _policy(plan, cooldown_s=60)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    grown = _grow(plan, autoscaler)[-1]
    assert grown.action == "up"
    # decode-1 starts and becomes ready; the load goes away.
    decode_1 = WorkerPlan.objects.get(deployment=plan, role="decode", index=1)
    _ready(plan, "decode-1", "decode", decode_1.port, T0 + timedelta(seconds=12))
    last_high = T0 + timedelta(seconds=10)
    _load(plan, last_high, T0 + timedelta(seconds=120), 0)
    for seconds in range(15, 121, INTERVAL_S):
        _tick(autoscaler, seconds)
    grown.refresh_from_db()
    assert grown.progress["decode_1_ready_at"] == (T0 + timedelta(seconds=12)).isoformat()
    shrunk = [d for d in _decisions(plan) if d.action == "down"]
    assert len(shrunk) == 1
    [down] = shrunk
    assert (down.current, down.target, down.reason) == (2, 1, decide.CHANGED)
    assert down.slots == [{"slot": "decode-1", "url": decode_1.url}]
    # As soon as the cooldown since the growth allows, the high readings long out of the window.
    assert down.at == grown.at + timedelta(seconds=policy.cooldown_s)
    assert down.at > last_high + timedelta(seconds=policy.down_window_s)
    held = [d for d in _decisions(plan) if grown.at < d.at < down.at]
    assert held[-1].reason == decide.COOLDOWN and held[-1].desired == 1
    assert [w.slot for w in plan.workers.filter(role="decode")] == ["decode-0"]
    assert list(AuditEntry.objects.filter(action="deployment.autoscale").order_by("pk")
                .values_list("changes", flat=True)) == [{"decode_instances": [1, 2]},
                                                         {"decode_instances": [2, 1]}]
    # The supervisor stops the removed worker; the decision says when it was gone.
    ManagedProcess.objects.filter(deployment=plan, slot="decode-1").update(
        state=ManagedProcess.State.STOPPED)
    _tick(autoscaler, 125)
    down.refresh_from_db()
    assert down.progress["decode_1_stopped_at"] == (T0 + timedelta(seconds=125)).isoformat()
    assert "done_at" in down.progress


def test_a_resize_keeps_what_changed_since_the_autoscaler_read_the_deployment(
        plan: Deployment) -> None:
    """The autoscaler reads the deployment when its evaluation starts; a stop or an edit that
    lands before it acts is not undone by its plan edit."""
    read_at_start = Deployment.objects.get(pk=plan.pk)
    Deployment.objects.filter(pk=plan.pk).update(
        desired_state=Deployment.DesiredState.STOPPED, concurrency=plan.concurrency + 3)
    resized = resize(read_at_start, "decode", 2)
    assert resized.slots == ["decode-1"]
    plan.refresh_from_db()
    assert plan.desired_state == Deployment.DesiredState.STOPPED
    assert plan.concurrency == read_at_start.concurrency + 3
    assert plan.workers.filter(role="decode").count() == 2


def test_an_open_schedule_window_grows_the_pool_without_load(plan: Deployment) -> None:
    window = {"name": "noon peak", "cron": f"{T0.minute} {T0.hour} * * *", "duration_s": 3600,
              "min_instances": 2}
    _policy(plan, schedules=[window])
    _load(plan, T0 - timedelta(seconds=20), T0 + timedelta(seconds=5), 0)
    _tick(Autoscaler(interval_s=INTERVAL_S), 5)
    [grown] = _decisions(plan)
    assert (grown.action, grown.reason, grown.current, grown.target) == (
        "up", decide.SCHEDULE, 1, 2)
    assert grown.inputs["schedule"] == {"window": "noon peak", "min_instances": 2}
    assert plan.workers.filter(role="decode").count() == 2


def test_the_ratio_band_moves_decode_with_a_growing_prefill(plan: Deployment) -> None:
    _policy(plan, role="prefill", signal="queue")
    _policy(plan, signal="queue")
    RatioBand.objects.create(deployment=plan, min_ratio=0.5, max_ratio=1.0)
    # Prefill's queue asks for more; decode's is within its thresholds.
    _load(plan, T0 - timedelta(seconds=20), T0 + timedelta(seconds=10), per_decode=2,
          per_prefill=HIGH)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    _tick(autoscaler, 5)
    _tick(autoscaler, 10)
    latest = {d.role: d for d in _decisions(plan)}
    assert (latest["prefill"].action, latest["prefill"].reason, latest["prefill"].target) == (
        "up", decide.CHANGED, 2)
    assert (latest["decode"].action, latest["decode"].reason, latest["decode"].target) == (
        "up", decide.RATIO, 2)
    assert latest["decode"].inputs["ratio_band"] == {"min_ratio": 0.5, "max_ratio": 1.0}
    counts = {role: plan.workers.filter(role=role).count() for role in ("prefill", "decode")}
    assert counts == {"prefill": 2, "decode": 2}


def test_an_instance_removed_before_it_was_ready_closes_its_growth(plan: Deployment) -> None:
    """The load went away while decode-1 started: the shrink takes it out of the plan before
    it is ready. Its growth ends "withdrawn"; a decode-1 planned again later (by hand, or by
    another decision) is not counted as the first one's start and join."""
    _policy(plan, cooldown_s=20)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    grown = _grow(plan, autoscaler)[-1]
    assert grown.action == "up"
    ManagedProcess.objects.create(deployment=plan, slot="decode-1", role="decode",
                                  port=grown.slots[0]["url"].rsplit(":", 1)[1],
                                  state=ManagedProcess.State.STARTING, log_path="/dev/null")
    _load(plan, T0 + timedelta(seconds=10), T0 + timedelta(seconds=80), 0)
    for seconds in range(15, 81, INTERVAL_S):
        _tick(autoscaler, seconds)
    [down] = [d for d in _decisions(plan) if d.action == "down"]
    assert down.slots == grown.slots
    grown.refresh_from_db()
    assert "decode_1_withdrawn_at" in grown.progress and "done_at" in grown.progress
    # decode-1 again, ready later: the closed growth does not take its times.
    PoolPolicy.objects.filter(deployment=plan).update(mode=PoolPolicy.Mode.OFF)
    resize(plan, "decode", 2)
    ManagedProcess.objects.filter(deployment=plan, slot="decode-1").update(
        state=READY, ready_at=T0 + timedelta(seconds=90))
    _tick(autoscaler, 95)
    grown.refresh_from_db()
    assert "decode_1_ready_at" not in grown.progress
    assert "decode_1_joined_at" not in grown.progress


def _router_scrape(deployment: Deployment, at: datetime, requests: int, seconds: float) -> None:
    """The router's last /metrics as the collector stores it: ``requests`` answered so far,
    each with its first token after ``seconds``."""
    bounds = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0]
    lines = ["# TYPE pdserve_router_ttft_seconds histogram"]
    lines += [f'pdserve_router_ttft_seconds_bucket{{revision="1",le="{b}"}} '
              f'{requests if seconds <= b else 0}' for b in bounds]
    lines += [f'pdserve_router_ttft_seconds_bucket{{revision="1",le="+Inf"}} {requests}',
              f'pdserve_router_ttft_seconds_count{{revision="1"}} {requests}',
              f'pdserve_router_ttft_seconds_sum{{revision="1"}} {requests * seconds}']
    router = ManagedProcess.objects.get(deployment=deployment, slot="router")
    ProcessScrape.objects.update_or_create(process=router, defaults={
        "scraped": at, "text": "\n".join(lines) + "\n"})


def test_the_slo_signal_reads_the_routers_ttft_over_its_window(plan: Deployment) -> None:
    """TTFT p90 at 2.2 times the plan's 2 s SLO over the router's window: the SLO ratio, read
    from the router's histogram deltas, asks for more decode instances."""
    _policy(plan, signal="slo", scale_up_at=0.55, scale_down_at=0.40, max_instances=2)
    autoscaler = Autoscaler(interval_s=INTERVAL_S)
    _load(plan, T0 - timedelta(seconds=20), T0 + timedelta(seconds=15), 1)
    for seconds, requests in ((0, 0), (5, 20), (10, 40), (15, 60)):
        _router_scrape(plan, T0 + timedelta(seconds=seconds), requests, 4.4)
        _tick(autoscaler, seconds)
    grown = [d for d in _decisions(plan) if d.action == "up"]
    assert grown, [(d.reason, d.value, d.inputs) for d in _decisions(plan)]
    assert grown[0].signal == "slo"
    assert grown[0].inputs["ttft_p90_s"] > 2.0
    assert grown[0].value == pytest.approx(grown[0].inputs["ttft_p90_s"] / 2.0)
    assert grown[0].value > 0.55
