"""The evaluator over stored snapshots: ready-made rules, state changes with their history,
first starts that are not outages, silences, inhibition, the lease, stopped deployments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from console.alerts.evaluation import Evaluator
from console.alerts.models import (
    Alert,
    AlertEvent,
    AlertRule,
    AlertState,
    Delivery,
    Notifier,
    Silence,
)
from console.alerts.ready_made import rule_specs
from console.deployments.models import Deployment
from console.live.models import MetricSample, ProcessScrape
from console.supervisor.models import ManagedProcess

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def _entry(role: str, up: int = 1, **stats: Any) -> dict[str, Any]:
    return {"role": role, "up": up, "cpu": 1.0, "rss": 1 << 20, **stats}


def _sample(deployment: Deployment, at: datetime, **processes: dict[str, Any]) -> None:
    MetricSample.objects.create(deployment=deployment, resolution=MetricSample.Resolution.SECOND,
                                created=at, data={"processes": {k.replace("_", "-"): v
                                                                for k, v in processes.items()}})


def _running(deployment: Deployment, restarts: int = 0) -> None:
    deployment.desired_state = Deployment.DesiredState.RUNNING
    deployment.save(update_fields=["desired_state"])
    for slot, role in (("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")):
        ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                      state=ManagedProcess.State.READY, ready_at=T0,
                                      restarts=restarts, log_path="/dev/null")


def _healthy(deployment: Deployment, at: datetime, decode_up: int = 1) -> None:
    _sample(deployment, at, prefill_0=_entry("prefill"), decode_0=_entry("decode", decode_up),
            router=_entry("router", rps=0.0, rps_by_status={}, ttft_p95=None))


def _alert(deployment: Deployment, key: str) -> Alert:
    return Alert.objects.get(rule__deployment=deployment, rule__key=key)


def test_a_new_deployment_gets_every_ready_made_rule_once(deployment: Deployment) -> None:
    keys = sorted(AlertRule.objects.filter(deployment=deployment).values_list("key", flat=True))
    assert keys == sorted(spec["key"] for spec in rule_specs(deployment))
    assert {"worker_down", "role_unavailable", "handoff_failures", "handoff_slow", "ttft_slo",
            "tpot_slo", "decode_queue", "prefill_queue", "kv_cache_full", "memory_near_limit",
            "router_5xx", "pd_fallback", "pd_load_skew", "port_foreign", "metrics_absent",
            "gate_failed", "scale_refused", "node_down", "gateway_shedding"} == set(keys)
    ttft = AlertRule.objects.get(deployment=deployment, key="ttft_slo")
    assert ttft.threshold == deployment.ttft_slo_ms / 1000


def test_a_worker_that_goes_down_fires_and_resolves_with_its_history(
        deployment: Deployment) -> None:
    _running(deployment, restarts=1)
    evaluator = Evaluator(holder="a")
    for second in range(5):
        _healthy(deployment, T0 + timedelta(seconds=second))
    evaluator.tick(T0 + timedelta(seconds=5))
    assert not Alert.objects.filter(state=AlertState.FIRING).exists()

    _healthy(deployment, T0 + timedelta(seconds=6), decode_up=0)
    report = evaluator.tick(T0 + timedelta(seconds=7))
    down = _alert(deployment, "worker_down")
    assert down.state == AlertState.FIRING and report.transitions >= 1
    assert down.labels["process"] == "decode-0" and down.labels["alertname"] == "WorkerDown"
    assert down.annotations["summary"] == f"decode-0 of {deployment.name} is down (not answering " \
                                          "its /metrics)"

    for second in range(8, 12):
        _healthy(deployment, T0 + timedelta(seconds=second))
    evaluator.tick(T0 + timedelta(seconds=12))
    down.refresh_from_db()
    assert down.state == AlertState.INACTIVE and down.resolved_at is not None
    history = [(e.from_state, e.to_state) for e in down.events.order_by("at", "pk")]
    assert history == [("inactive", "firing"), ("firing", "inactive")]
    assert down.events.order_by("at").first().value == 0.0


def test_a_planned_worker_missing_from_the_snapshot_is_down(deployment: Deployment) -> None:
    _running(deployment, restarts=2)
    _sample(deployment, T0, prefill_0=_entry("prefill"), router=_entry("router"))
    Evaluator(holder="a").tick(T0 + timedelta(seconds=1))
    assert _alert(deployment, "worker_down").labels["process"] == "decode-0"
    assert _alert(deployment, "role_unavailable").state == AlertState.PENDING


def test_a_first_start_is_not_an_outage(deployment: Deployment) -> None:
    deployment.desired_state = Deployment.DesiredState.RUNNING
    deployment.save(update_fields=["desired_state"])
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode", port=1,
                                  state=ManagedProcess.State.STARTING, log_path="/dev/null")
    _sample(deployment, T0, decode_0=_entry("decode", up=0))
    Evaluator(holder="a").tick(T0 + timedelta(seconds=1))
    assert not Alert.objects.exclude(state=AlertState.INACTIVE).exists()


def test_a_silence_mutes_the_notification_and_the_history_says_so(
        deployment: Deployment, owner: Any) -> None:
    _running(deployment, restarts=1)
    silence = Silence.objects.create(
        team=deployment.team, matchers=[{"name": "alertname", "op": "=", "value": "WorkerDown"}],
        starts_at=T0 - timedelta(minutes=1), ends_at=T0 + timedelta(hours=1),
        comment="maintenance", created_by=owner)
    _healthy(deployment, T0, decode_up=0)
    Evaluator(holder="a").tick(T0 + timedelta(seconds=1))
    event = AlertEvent.objects.get(alert__rule__key="worker_down")
    assert event.to_state == AlertState.FIRING and event.muted_by == f"silence #{silence.pk}"


def test_worker_down_inhibits_the_latency_alerts_of_its_deployment(
        deployment: Deployment) -> None:
    _running(deployment, restarts=1)
    AlertRule.objects.filter(deployment=deployment, key="ttft_slo").update(window_s=10, for_s=0)
    _sample(deployment, T0, prefill_0=_entry("prefill"), decode_0=_entry("decode", up=0),
            router=_entry("router", ttft_p95=30.0))
    Evaluator(holder="a").tick(T0 + timedelta(seconds=1))
    ttft = AlertEvent.objects.get(alert__rule__key="ttft_slo")
    assert ttft.to_state == AlertState.FIRING and ttft.muted_by == "inhibited by WorkerDown"
    down = AlertEvent.objects.get(alert__rule__key="worker_down")
    assert down.muted_by == ""


def test_only_the_lease_holder_evaluates(deployment: Deployment) -> None:
    _running(deployment, restarts=1)
    _healthy(deployment, T0, decode_up=0)
    first, second = Evaluator(holder="a"), Evaluator(holder="b")
    assert first.tick(T0 + timedelta(seconds=1)).evaluated
    assert not second.tick(T0 + timedelta(seconds=2)).evaluated
    assert AlertEvent.objects.filter(alert__rule__key="worker_down").count() == 1
    # The holder stalls past the lease: the other takes over and goes on from the stored state.
    later = T0 + timedelta(seconds=30)
    _healthy(deployment, later - timedelta(seconds=1), decode_up=0)
    assert second.tick(later).evaluated
    assert not first.tick(later + timedelta(seconds=1)).evaluated
    assert AlertEvent.objects.filter(alert__rule__key="worker_down").count() == 1
    assert _alert(deployment, "worker_down").state == AlertState.FIRING


def test_stopping_a_deployment_ends_its_alerts(deployment: Deployment) -> None:
    _running(deployment, restarts=1)
    _healthy(deployment, T0, decode_up=0)
    evaluator = Evaluator(holder="a")
    evaluator.tick(T0 + timedelta(seconds=1))
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.STOPPED)
    evaluator.tick(T0 + timedelta(seconds=6))
    assert not Alert.objects.exclude(state=AlertState.INACTIVE).exists()
    last = AlertEvent.objects.filter(alert__rule__key="worker_down").order_by("-at").first()
    assert (last.from_state, last.to_state) == ("firing", "inactive")


def test_a_ratio_rule_waits_for_its_minimum_request_count(deployment: Deployment) -> None:
    _running(deployment)
    AlertRule.objects.filter(deployment=deployment, key="router_5xx").update(for_s=0)
    evaluator = Evaluator(holder="a")
    # One failed request a second for 10 s: 10 requests, under the rule's minimum of 20.
    for second in range(10):
        _sample(deployment, T0 + timedelta(seconds=second), prefill_0=_entry("prefill"),
                decode_0=_entry("decode"),
                router=_entry("router", rps=1.0, rps_by_status={"503": 1.0}))
    evaluator.tick(T0 + timedelta(seconds=10))
    assert not Alert.objects.filter(rule__key="router_5xx").exclude(
        state=AlertState.INACTIVE).exists()
    for second in range(10, 25):
        _sample(deployment, T0 + timedelta(seconds=second), prefill_0=_entry("prefill"),
                decode_0=_entry("decode"),
                router=_entry("router", rps=1.0, rps_by_status={"503": 1.0}))
    evaluator.tick(T0 + timedelta(seconds=25))
    assert _alert(deployment, "router_5xx").state == AlertState.FIRING


def test_metrics_absent_names_a_family_a_live_worker_lacks(deployment: Deployment) -> None:
    _running(deployment)
    for process in ManagedProcess.objects.filter(deployment=deployment):
        text = ("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
                "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
                "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 3\n"
                "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 3\n"
                "# TYPE vllm:time_to_first_token_seconds histogram\n"
                "# TYPE vllm:request_time_per_output_token_seconds histogram\n"
                "# TYPE pdserve_router_requests_total counter\n"
                "# TYPE pdserve_router_first_byte_seconds histogram\n"
                "# TYPE pdserve_router_prefill_seconds histogram\n"
                "# TYPE pdserve_router_pd_fallback_total counter\n"
                "# TYPE pdserve_router_kv_handoffs_total counter\n")
        if process.slot != "decode-0":  # decode's engine renamed its KV usage gauge
            text += "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.1\n"
        ProcessScrape.objects.create(process=process, scraped=T0, text=text)
    AlertRule.objects.filter(deployment=deployment, key="metrics_absent").update(for_s=0)
    _healthy(deployment, T0)
    Evaluator(holder="a").tick(T0 + timedelta(seconds=1))
    alert = _alert(deployment, "metrics_absent")
    assert alert.state == AlertState.FIRING and alert.value == 1.0
    assert alert.annotations["description"] == "vllm:kv_cache_usage_perc on decode-0"


def test_the_readme_documents_every_ready_made_rule_with_its_reason(
        deployment: Deployment) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for spec in rule_specs(deployment):
        row = next((line for line in readme.splitlines()
                    if line.startswith(f"| `{spec['key']}` ")), None)
        assert row is not None, f"README: no row for {spec['key']}"
        assert spec["reason"] in row, f"README: {spec['key']}'s reason differs"


def test_ready_made_thresholds_follow_the_plan_unless_edited(deployment: Deployment) -> None:
    AlertRule.objects.filter(deployment=deployment, key="tpot_slo").update(threshold=0.7)
    deployment.ttft_slo_ms, deployment.tpot_slo_ms, deployment.concurrency = 900, 50, 6
    deployment.save()
    thresholds = dict(AlertRule.objects.filter(deployment=deployment).values_list("key",
                                                                                  "threshold"))
    assert thresholds["ttft_slo"] == 0.9
    assert thresholds["tpot_slo"] == 0.7  # edited by someone: kept
    assert thresholds["decode_queue"] == thresholds["prefill_queue"] == 6


def test_an_alert_that_fires_after_its_inhibitor_is_muted_too(deployment: Deployment) -> None:
    _running(deployment, restarts=1)
    evaluator = Evaluator(holder="a")
    _sample(deployment, T0, prefill_0=_entry("prefill"), router=_entry("router"))
    evaluator.tick(T0 + timedelta(seconds=1))
    assert _alert(deployment, "worker_down").state == AlertState.FIRING
    for second in range(2, 16):
        _sample(deployment, T0 + timedelta(seconds=second), prefill_0=_entry("prefill"),
                router=_entry("router"))
    evaluator.tick(T0 + timedelta(seconds=16))
    role = AlertEvent.objects.filter(alert__rule__key="role_unavailable").order_by("at").last()
    assert role.to_state == AlertState.FIRING
    assert role.muted_by == "inhibited by WorkerDown"


def test_snapshots_from_before_a_first_ready_are_the_start_not_an_outage(
        deployment: Deployment) -> None:
    """The supervisor saw prefill ready at T0+4.5, before the collector's next snapshot; the
    snapshots until then say it was not up. They are its start: neither down nor one-sided."""
    _running(deployment)
    ManagedProcess.objects.filter(deployment=deployment, slot="prefill-0").update(
        ready_at=T0 + timedelta(seconds=4.5))
    for second in range(5):
        _sample(deployment, T0 + timedelta(seconds=second), prefill_0=_entry("prefill", up=0),
                decode_0=_entry("decode"), router=_entry("router"))
    Evaluator(holder="a").tick(T0 + timedelta(seconds=4.8))
    assert not AlertEvent.objects.exists()


def test_an_episode_never_notified_resolves_without_a_notification(
        deployment: Deployment) -> None:
    Notifier.objects.create(team=deployment.team, name="hook", kind="webhook",
                            url="http://127.0.0.1:9/hook")
    _running(deployment, restarts=1)
    AlertRule.objects.filter(deployment=deployment, key="ttft_slo").update(window_s=10, for_s=0)
    evaluator = Evaluator(holder="a")
    _sample(deployment, T0, prefill_0=_entry("prefill"), decode_0=_entry("decode", up=0),
            router=_entry("router", ttft_p95=30.0))
    evaluator.tick(T0 + timedelta(seconds=1))
    # Both clear at once: the latency alert was muted by worker down the whole time.
    _healthy(deployment, T0 + timedelta(seconds=20))
    evaluator.tick(T0 + timedelta(seconds=21))
    sent = sorted((d.payload["commonLabels"]["alertname"], d.status)
                  for d in Delivery.objects.all())
    assert sent == [("WorkerDown", "firing"), ("WorkerDown", "resolved")]


def test_a_rollouts_green_start_and_retired_blue_raise_no_outage(deployment: Deployment) -> None:
    """make up under a blue-green rollout: WorkerDown fired for green's workers while they
    started (slots in no plan yet), and for blue's decode once it was stopped on purpose,
    that one firing ever after since nothing evaluated it any more."""
    _running(deployment, restarts=1)
    for slot, role, state in (("prefill-0@r2", "prefill", ManagedProcess.State.STARTING),
                              ("decode-0@r2", "decode", ManagedProcess.State.STARTING),
                              ("decode-0@r1", "decode", ManagedProcess.State.READY)):
        ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                      state=state, log_path="/dev/null",
                                      ready_at=T0 if state == ManagedProcess.State.READY else None,
                                      restarts=1 if slot.endswith("@r1") else 0)
    evaluator = Evaluator(holder="a")
    starting = {"prefill-0@r2": _entry("prefill", up=0), "decode-0@r2": _entry("decode", up=0)}
    for second in range(3):
        _sample(deployment, T0 + timedelta(seconds=second), prefill_0=_entry("prefill"),
                decode_0=_entry("decode"), router=_entry("router", rps=0.0, rps_by_status={},
                                                         ttft_p95=None),
                **{k.replace("-", "_"): v for k, v in starting.items()},
                decode_0_r1=_entry("decode", up=0))
    # _sample turns "_" into "-": the @ of the slots is put back here.
    for sample in MetricSample.objects.filter(deployment=deployment):
        sample.data = {"processes": {k.replace("-r", "@r"): v
                                     for k, v in sample.data["processes"].items()}}
        sample.save(update_fields=["data"])
    evaluator.tick(T0 + timedelta(seconds=3))
    firing = {a.labels.get("process") for a in Alert.objects.filter(state=AlertState.FIRING)}
    assert firing == {"decode-0@r1"}  # blue's decode down while it still counts
    # Then blue is stopped on purpose: its alert ends at once, green's starts stay quiet.
    ManagedProcess.objects.filter(slot="decode-0@r1").update(state=ManagedProcess.State.STOPPED)
    evaluator.tick(T0 + timedelta(seconds=4))
    assert not Alert.objects.filter(state=AlertState.FIRING).exists()
    blue = Alert.objects.get(labels__process="decode-0@r1")
    assert blue.state == AlertState.INACTIVE and blue.resolved_at is not None
