"""The troubleshooting view: each of the eight symptoms built in the database the way the
console would store it (process rows, 1 s metric samples, log lines, checks, alerts, a gate
result), named present with the right likeliest cause; a healthy deployment shows none; the
page, the API and ``manage.py doctor`` say the same; an alert links to its symptom."""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.alerts import symptom_links
from console.alerts.models import Alert, AlertRule
from console.alerts.notifiers.mail import body
from console.catalog.models import BaseModel, Variant
from console.deployments.models import Deployment
from console.diagnosis import log_patterns, services
from console.diagnosis.api.serializers import DoctorReportSerializer
from console.diagnosis.examination import RULES, examine, worst
from console.diagnosis.observations import LogHit, Observations, Plan, PlannedWorker, Sample
from console.diagnosis.symptoms import ORDER, TITLES
from console.diagnosis.symptoms import State as SymptomState
from console.live.models import LogLine, MetricSample
from console.quality.models import GateResult
from console.supervisor.models import ManagedProcess
from tests.console.tiny_models import make_plan, register, running, use_variant

State = ManagedProcess.State


# ---- building a deployment's facts --------------------------------------------------------------
@pytest.fixture
def deployment(db: None, tmp_path: Path) -> Deployment:
    """A running tiny 1P1D plan that passes every check, with its three processes ready."""
    plan = running(make_plan(tmp_path))
    now = timezone.now()
    for worker in plan.workers.all():
        _process(plan, worker.slot, worker.role, worker.port, now)
    _process(plan, "router", "router", plan.router_port, now)
    GateResult.objects.create(deployment=plan, trigger=GateResult.Trigger.START,
                              state=GateResult.State.PASSED, prompts=8, min_agreement=0.9,
                              max_mean_delta=0.5, action="block", finished_at=now)
    return plan


def _process(deployment: Deployment, slot: str, role: str, port: int,
             now: datetime) -> ManagedProcess:
    return ManagedProcess.objects.create(
        deployment=deployment, slot=slot, role=role, port=port, state=State.READY,
        started_at=now - timedelta(minutes=20), ready_at=now - timedelta(minutes=19),
        log_path="/dev/null")


def worker(role: str, **values: Any) -> dict[str, Any]:
    entry = {"role": role, "up": 1, "running": 1, "waiting": 0, "kv_usage": 0.05,
             "prompt_tps": 0.0, "gen_tps": 30.0, "rps": 0.5, "ttft_p50": 0.05,
             "ttft_p95": 0.1, "tpot_p50": 0.03, "tpot_p95": 0.04, "cpu": 40.0,
             "rss": 2_700_000_000}
    if role == "prefill":
        entry.update(running=0, gen_tps=0.5, prompt_tps=400.0)
    return {**entry, **values}


def router(deployment: Deployment, failed_now: int = 0, **values: Any) -> dict[str, Any]:
    prefill, decode = (deployment.workers.get(role=r) for r in ("prefill", "decode"))
    pair = {"prefill": prefill.url, "decode": decode.url, "ok": 120, "failed": failed_now,
            "failed_now": failed_now, "prefill_slot": "prefill-0", "decode_slot": "decode-0",
            "last_failure": ({"at": timezone.now().isoformat(), "error": "decode kv_handoff"}
                             if failed_now else None)}
    entry = {"role": "router", "up": 1, "rps": 1.0, "rps_by_status": {"200": 1.0},
             "ttft_p50": 0.2, "ttft_p95": 0.3, "handoff_p50": 0.1, "handoff_p95": 0.2,
             "fallback_ps": 0.0, "in_flight": {}, "backend_errors_ps": {},
             "prefill_tokens_in_flight": 0, "prefill_speed": 900.0, "handoffs": [pair]}
    return {**entry, **values}


Shape = Callable[[int], dict[str, dict[str, Any]]]


def samples(deployment: Deployment, seconds: int, shape: Shape | None = None) -> None:
    """1 s samples of the last ``seconds``; ``shape(age)`` replaces entries (age 0 = now)."""
    now = timezone.now()
    rows = []
    for age in range(seconds, -1, -1):
        processes = {"prefill-0": worker("prefill"), "decode-0": worker("decode"),
                     "router": router(deployment)}
        if shape is not None:
            processes.update(shape(age))
        rows.append(MetricSample(deployment=deployment, resolution=MetricSample.Resolution.SECOND,
                                 created=now - timedelta(seconds=age),
                                 data={"processes": processes}))
    MetricSample.objects.bulk_create(rows)


def log(deployment: Deployment, slot: str, *texts: str) -> None:
    process = ManagedProcess.objects.get(deployment=deployment, slot=slot)
    start = LogLine.objects.filter(process=process).count()
    now = timezone.now()
    LogLine.objects.bulk_create([
        LogLine(process=process, seq=start + i + 1, created=now - timedelta(seconds=30 - i),
                text=text) for i, text in enumerate(texts)])


def fire(deployment: Deployment, key: str, summary: str = "") -> Alert:
    rule = AlertRule.objects.get(deployment=deployment, key=key)
    now = timezone.now()
    labels = {"alertname": rule.alertname, "deployment": deployment.name,
              "severity": rule.severity, "series": rule.series, "rule": key}
    return Alert.objects.create(rule=rule, deployment=deployment, fingerprint=key[:16],
                                labels=labels, annotations={"summary": summary or rule.name},
                                state="firing", value=1.0, active_since=now, fired_at=now,
                                evaluated_at=now)


def doctor(deployment: Deployment) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in services.report(deployment)["symptoms"]}


def assert_named(found: dict[str, dict[str, Any]], symptom: str, cause: str) -> None:
    assert found[symptom]["state"] == "present", found[symptom]
    assert found[symptom]["causes"], found[symptom]
    assert found[symptom]["causes"][0]["id"] == cause, found[symptom]["causes"]


# ---- a healthy deployment ----------------------------------------------------------------------
def test_a_healthy_deployment_shows_no_symptom(deployment: Deployment) -> None:
    samples(deployment, 120)
    log(deployment, "decode-0", "INFO 12-04 21:30:01 [loggers.py:123] Engine 000: Avg prompt "
        "throughput: 0.0 tokens/s", "INFO:     127.0.0.1:51234 - \"POST /v1/completions "
        "HTTP/1.1\" 200 OK")
    report = services.report(deployment)
    assert report["state"] == "not_seen"
    assert [(s["id"], s["state"]) for s in report["symptoms"]] == [
        (symptom, "not_seen") for symptom in ORDER]
    assert all(not s["evidence"] and not s["causes"] for s in report["symptoms"])


# ---- 1: the router cannot reach a backend ------------------------------------------------------
def test_a_taken_backend_port_is_named(deployment: Deployment) -> None:
    decode = deployment.workers.get(role="decode")
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        state=State.FAILED, restarts=1, exit_code=1,
        last_error="exited with code 1; restarting in 2 s. Last log line: ERROR ...")
    samples(deployment, 60, lambda age: {} if age > 30 else {
        "decode-0": {"role": "decode", "up": 0},
        "router": router(deployment, backend_errors_ps={"decode ClientConnectorError": 1.0})})
    log(deployment, "decode-0",
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
        f"{decode.port}): address already in use")
    log(deployment, "router", f"decode {decode.url} out of rotation: Cannot connect to host "
        f"127.0.0.1:{decode.port} ssl:default [Connect call failed ('127.0.0.1', {decode.port})]")
    fire(deployment, "worker_down", "decode-0 is down")
    found = doctor(deployment)
    assert_named(found, "backend-unreachable", "port-taken")
    texts = " | ".join(e["text"] for e in found["backend-unreachable"]["evidence"])
    assert "ClientConnectorError" in texts and "address already in use" in texts
    assert "WorkerDown" in texts and "decode-0 has not answered /metrics" in texts
    fixes = found["backend-unreachable"]["causes"][0]["fixes"]
    assert fixes[0]["url"] == f"/deployments/{deployment.name}/edit/#plan-form"
    log_links = [e["url"] for e in found["backend-unreachable"]["evidence"] if e["source"] == "log"]
    assert all(link.startswith("/api/v1/processes/") and "after=" in link for link in log_links)


def test_a_port_held_by_another_process_fails_the_live_check_and_is_named(
        deployment: Deployment) -> None:
    decode = deployment.workers.get(role="decode")
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        state=State.FAILED, restarts=1, exit_code=1)
    with socket.socket() as holder:
        holder.bind((decode.host, decode.port))
        holder.listen()
        found = doctor(deployment)
    assert_named(found, "backend-unreachable", "port-taken")
    [check] = [e for e in found["backend-unreachable"]["evidence"] if e["source"] == "check"]
    assert f"port {decode.port} (decode-0) is already bound by" in check["text"]
    assert check["strong"]


def test_refused_calls_to_a_ready_worker_point_at_its_address(deployment: Deployment) -> None:
    samples(deployment, 30, lambda age: {
        "router": router(deployment, backend_errors_ps={"prefill ClientConnectorError": 0.5})})
    found = doctor(deployment)
    assert_named(found, "backend-unreachable", "address")


def test_a_backend_lost_and_restarted_is_named_from_the_routers_log_alone(
        deployment: Deployment) -> None:
    """A decode SIGKILLed and restarted within a few seconds: no snapshot caught it down and no
    request failed, only the router's log says it went out of rotation."""
    decode = deployment.workers.get(role="decode")
    lost = (f"2026-12-05 12:54:27,783 WARNING pdserve.router.backends decode {decode.url} out "
            f"of rotation: ClientConnectorError: Cannot connect to host 127.0.0.1:{decode.port}")
    log(deployment, "router", lost)
    found = doctor(deployment)
    # No worker went away: the router called where nothing listens.
    assert found["backend-unreachable"]["causes"][0]["id"] == "address"
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        restarts=1, started_at=timezone.now() - timedelta(seconds=20))
    found = doctor(deployment)
    assert_named(found, "backend-unreachable", "backend-down")


# ---- 2: KV transfer --------------------------------------------------------------------------------
def test_a_slow_prefill_is_not_a_slow_hand_off(deployment: Deployment) -> None:
    # Seen on make up after a verification's sweep: 1,000-token prompts put "prefill plus
    # hand-off" p95 over 0.5 s while the hand-off itself took 80 ms.
    samples(deployment, 60, lambda age: {"router": router(deployment, handoff_p95=0.6,
                                                          kv_handoff_p95=0.08)})
    assert doctor(deployment)["kv-transfer-timeout"]["state"] == "not_seen"
    MetricSample.objects.filter(deployment=deployment).delete()
    samples(deployment, 60, lambda age: {"router": router(deployment, handoff_p95=0.9,
                                                          kv_handoff_p95=0.7)})
    found = doctor(deployment)["kv-transfer-timeout"]
    assert found["state"] != "not_seen"
    assert any("KV hand-off p95" in e["text"] for e in found["evidence"]), found["evidence"]


def test_failing_kv_hand_offs_are_named(deployment: Deployment) -> None:
    samples(deployment, 60, lambda age: {} if age > 20 else {
        "router": router(deployment, failed_now=1, handoff_p95=5.4, kv_handoff_p95=5.0,
                         backend_errors_ps={"decode kv_handoff": 1.0})})
    log(deployment, "decode-0",
        "ERROR 12-04 21:40:02 [scheduler.py:3418] Failing 1 request(s) due to KV load failure "
        "(failure_policy=fail, 512 tokens affected). Request IDs: {'cmpl-abc-0'}")
    log(deployment, "prefill-0",
        "WARNING 12-04 21:40:31 [base_worker.py:3033] Releasing expired KV blocks for request "
        "cmpl-abc-0 which were retrieved by 0 remote worker(s) before lease expired.")
    found = doctor(deployment)
    assert_named(found, "kv-transfer-timeout", "slow-channel")
    texts = " | ".join(e["text"] for e in found["kv-transfer-timeout"]["evidence"])
    assert "hand-off(s) prefill-0 -> decode-0 failed" in texts
    assert "KV load failure" in texts and "Releasing expired KV blocks" in texts
    targets = [f["target"] for f in found["kv-transfer-timeout"]["causes"][0]["fixes"]]
    assert targets == ["plan:kv_channel", "plan:kv_load_failure"]


def test_a_full_kv_directory_is_named(deployment: Deployment) -> None:
    samples(deployment, 30, lambda age: {"router": router(deployment, failed_now=1)})
    log(deployment, "prefill-0", "WARNING 12-04 21:41:00 [shared_storage.py:78] KV not saved to "
        "shared storage /dev/shm/pdserve/tiny-1p1d (OSError: [Errno 28] No space left on "
        "device); the decode worker will compute these prompts itself")
    assert_named(doctor(deployment), "kv-transfer-timeout", "storage")


# ---- 3: out of memory at start -------------------------------------------------------------------
def test_a_context_that_cannot_fit_is_named_with_vllms_estimate(deployment: Deployment) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        state=State.FAILED, restarts=2, exit_code=1, ready_at=None,
        last_error="exited with code 1; restarting in 4 s")
    log(deployment, "decode-0",
        "ValueError: To serve at least one request with the model's max seq len (65536), "
        "(2.25 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(1.00 GiB). Based on the available memory, the estimated maximum model length is "
        "29120. Try increasing `gpu_memory_utilization` (which also controls CPU memory "
        "reservation on the CPU backend, despite its name) or decreasing `max_model_len` when "
        "initializing the engine.")
    found = doctor(deployment)
    assert_named(found, "oom-at-start", "kv-cache")
    top = found["oom-at-start"]["causes"][0]
    assert "29120 tokens would fit" in top["text"]
    assert top["fixes"][0]["url"] == f"/deployments/{deployment.name}/edit/#id_max_model_len"
    # Two restarts are suspected, and they point at the same memory.
    assert found["restarts"]["state"] == "suspected"
    assert found["restarts"]["causes"][0]["id"] == "out-of-memory"


def test_a_context_that_cannot_fit_is_refused_at_start_and_named(
        db: None, tmp_path: Path, api: APIClient) -> None:
    # Made real through the start itself: a tiny model of 16 layers allowing a million tokens
    # (2 KiB of KV a token, 2 GiB at full context) planned at that context with a 1 GiB KV
    # cache. The pre-flight check refuses the start before vLLM would (vLLM's own refusal is
    # the log line of the test above), and the doctor names the KV cache from the check.
    base = BaseModel.objects.get_or_create(name="tiny")[0]
    long = register(base, tmp_path, "long", config={"max_position_embeddings": 1_048_576,
                                                    "num_hidden_layers": 16})
    plan = make_plan(tmp_path, name="tiny-long")
    use_variant(plan, long, "prefill")
    use_variant(plan, long, "decode")
    Deployment.objects.filter(pk=plan.pk).update(max_model_len=1_048_576, kv_cache_gib=1)
    response = api.post(f"/api/v1/deployments/{plan.pk}/start")
    assert response.status_code == 409, response.json()
    assert {r["id"] for r in response.json()["results"]} == {"memory.fit"}
    plan.refresh_from_db()
    found = doctor(plan)["oom-at-start"]
    assert found["state"] in ("present", "suspected"), found
    assert found["causes"][0]["id"] == "kv-cache", found["causes"]
    assert any("cannot hold one request at full context" in e["text"]
               for e in found["evidence"]), found["evidence"]


def test_a_worker_killed_before_it_was_ready_is_an_oom(deployment: Deployment) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot="prefill-0").update(
        state=State.FAILED, restarts=1, exit_code=-9, ready_at=None)
    assert_named(doctor(deployment), "oom-at-start", "node-memory")


# ---- 4: output differs ----------------------------------------------------------------------------
def test_different_sampling_defaults_are_named(deployment: Deployment, tmp_path: Path) -> None:
    hot = register(BaseModel.objects.get(name="tiny"), tmp_path, "hot",
                   generation_config={"top_p": 0.5})
    use_variant(deployment, hot, "decode")
    GateResult.objects.create(deployment=deployment, trigger=GateResult.Trigger.DEMAND,
                              state=GateResult.State.FAILED, prompts=8, min_agreement=0.9,
                              max_mean_delta=0.5, action="block", finished_at=timezone.now(),
                              report={"reasons": ["decode-0: agreement 0.41 < 0.9"]})
    fire(deployment, "gate_failed", "the output gate failed")
    found = doctor(deployment)
    assert_named(found, "output-differs", "sampling")
    texts = " | ".join(e["text"] for e in found["output-differs"]["evidence"])
    assert "agreement 0.41" in texts and "sampling.defaults" in texts
    assert found["output-differs"]["causes"][0]["fixes"][0]["target"] == "plan:sampling_defaults"


def test_a_damaged_full_precision_decode_beside_a_quantized_prefill_is_its_model_files(
        deployment: Deployment, tmp_path: Path) -> None:
    # The quality suite's injection (tests/quality/test_gate_e2e.py): prefill W8A8, decode a
    # noisy copy of the weights. The gate names decode; quantization is not what failed it.
    base = BaseModel.objects.get(name="tiny")
    w8a8, broken = register(base, tmp_path, "w8a8"), register(base, tmp_path, "broken")
    Variant.objects.filter(pk=w8a8.pk).update(quantization="w8a8")
    use_variant(deployment, w8a8, "prefill")
    use_variant(deployment, broken, "decode")
    GateResult.objects.create(deployment=deployment, trigger=GateResult.Trigger.DEMAND,
                              state=GateResult.State.FAILED, prompts=8, min_agreement=0.9,
                              max_mean_delta=0.5, action="block", finished_at=timezone.now(),
                              report={"reasons": ["decode-0 (broken): top-1 agreement 12.5% is "
                                                  "below 90.0%"]})
    found = doctor(deployment)
    assert_named(found, "output-differs", "model-files")
    assert "decode-0 (broken)" in found["output-differs"]["evidence"][0]["text"]
    # The same gate failing on the quantized prefill is the quantization.
    GateResult.objects.filter(deployment=deployment).update(report={"reasons": [
        "prefill-0 (w8a8): top-1 agreement 12.5% is below 90.0%"]})
    assert_named(doctor(deployment), "output-differs", "quantization")


# ---- 5: queueing ------------------------------------------------------------------------------
def test_a_growing_decode_queue_is_named(deployment: Deployment) -> None:
    # Past the plan's concurrency (8): the queue grows by one request every 4 s.
    samples(deployment, 90, lambda age: {"decode-0": worker(
        "decode", running=8, waiting=max(0, 24 - age // 4), kv_usage=0.6)})
    found = doctor(deployment)
    assert_named(found, "queueing", "capacity")
    assert "the queue is growing" in found["queueing"]["evidence"][0]["text"]
    assert found["ttft-high"]["state"] == "not_seen"


def test_a_flood_past_the_plans_concurrency_is_named(deployment: Deployment) -> None:
    # vLLM runs them all at once (its own cap is --max-num-seqs): nothing waits in the engine,
    # but the router has three times the plan's 8 requests in flight to the one decode worker.
    decode = deployment.workers.get(role="decode")
    samples(deployment, 90, lambda age: {
        "decode-0": worker("decode", running=24),
        "router": router(deployment, in_flight={"decode": {decode.url: 24}})})
    found = doctor(deployment)
    assert_named(found, "queueing", "capacity")
    assert "24 requests in flight to decode" in found["queueing"]["evidence"][0]["text"]


# ---- 6: TTFT ------------------------------------------------------------------------------------
def test_a_slow_first_token_behind_prefill_is_named(deployment: Deployment) -> None:
    samples(deployment, 90, lambda age: {
        "prefill-0": worker("prefill", running=1, waiting=4, ttft_p95=2.5),
        "router": router(deployment, ttft_p95=5.0, handoff_p95=2.6,
                         prefill_tokens_in_flight=4000)})
    found = doctor(deployment)
    assert_named(found, "ttft-high", "prefill-capacity")
    assert "the SLO is 2 s" in found["ttft-high"]["evidence"][0]["text"]


def test_one_slow_prompt_beside_fast_ones_is_prefill_not_the_hand_off(deployment: Deployment) -> None:
    # A hung prefill engine (the live test's SIGSTOP): one prompt's first token after 7 s, three
    # fast prompts in later samples, and the router's prefill call, in the next sample, in its
    # own coarser buckets. Averaged, prefill's 7 s sank below the SLO and the hand-off took the
    # blame for the difference.
    def shape(age: int) -> dict[str, dict[str, Any]]:
        quiet = {"ttft_p95": None, "ttft_p50": None}
        prefill = {20: 7.2, 15: 0.02, 10: 0.02, 5: 0.02}.get(age)
        return {"prefill-0": worker("prefill", **(quiet if prefill is None else {
                    "ttft_p95": prefill, "ttft_p50": prefill})),
                "router": router(deployment, ttft_p95=7.5 if age == 19 else None,
                                 ttft_p50=None, handoff_p50=None,
                                 handoff_p95=9.5 if age == 19 else None)}
    samples(deployment, 90, shape)
    found = doctor(deployment)
    assert_named(found, "ttft-high", "slow-prefill")
    assert "handoff" not in [c["id"] for c in found["ttft-high"]["causes"]]


# ---- 7: stalls ------------------------------------------------------------------------------------
def test_a_decode_that_stops_mid_stream_is_named(deployment: Deployment) -> None:
    samples(deployment, 120, lambda age: {} if age > 15 else {
        "decode-0": worker("decode", running=2, gen_tps=0.0, tpot_p95=1.2, tpot_p50=0.9)})
    found = doctor(deployment)
    assert_named(found, "stalls", "hung-worker")
    texts = " | ".join(e["text"] for e in found["stalls"]["evidence"])
    assert "generated no token for 15 s" in texts and "spikes" in texts


def test_a_stall_on_a_decode_that_also_computed_prompts_is_a_hung_worker_first(
        deployment: Deployment) -> None:
    # Seen live: prompts computed on decode earlier in the minute (pd_adaptive keeps short
    # ones local) tied interference with the hang, and the hang was not named first.
    samples(deployment, 60, lambda age: {
        "decode-0": worker("decode", running=4, gen_tps=0.0)} if age < 12 else {
        "decode-0": worker("decode", running=4, prompt_tps=900.0)})
    found = doctor(deployment)
    assert_named(found, "stalls", "hung-worker")
    assert "prefill-interference" in [c["id"] for c in found["stalls"]["causes"]]


def test_a_decode_stopped_with_streams_running_is_a_stall(deployment: Deployment) -> None:
    # SIGSTOP: the stopped server answers no /metrics until it goes on.
    samples(deployment, 60, lambda age: {"decode-0": {"role": "decode", "up": 0}}
            if 10 <= age < 20 else {"decode-0": worker("decode", running=3)})
    found = doctor(deployment)
    assert_named(found, "stalls", "hung-worker")


# ---- 8: restarts ----------------------------------------------------------------------------------
def test_a_worker_that_keeps_crashing_at_start_is_named(deployment: Deployment) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        state=State.FAILED, restarts=5, exit_code=1, ready_at=None,
        last_error="exited with code 1; restarting in 16 s. Last log line: "
                   "RuntimeError: Engine core initialization failed. See root cause above.")
    found = doctor(deployment)
    assert_named(found, "restarts", "start-config")
    assert "decode-0 restarted 5 time(s)" in found["restarts"]["evidence"][0]["text"]


def test_health_check_failures_point_at_thresholds_and_caps(deployment: Deployment) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        restarts=3, last_error="health check failing", state=State.STARTING)
    found = doctor(deployment)
    assert_named(found, "restarts", "health-check")
    assert [f["target"] for f in found["restarts"]["causes"][0]["fixes"]] == [
        "plan:concurrency", "settings:PDSERVE_START_STALL_S"]


# ---- the rules' parts -------------------------------------------------------------------------------
def test_every_symptom_has_a_title_a_rule_and_alerts_that_link_to_it() -> None:
    assert tuple(RULES) == ORDER == tuple(TITLES)
    assert set(symptom_links.SYMPTOM_OF_RULE.values()) <= set(ORDER)
    assert set(symptom_links.SYMPTOM_OF_SERIES.values()) <= set(ORDER)


@pytest.mark.parametrize(("line", "kind"), [
    ("ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine", log_patterns.OOM_NO_CACHE),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     log_patterns.OOM),
    ("pydantic_core._pydantic_core.ValidationError: User-specified max_model_len (65536) is "
     "greater than the derived max_model_len (max_position_embeddings=8192 or "
     "model_max_length=None in model's config.json).", log_patterns.CONTEXT_TOO_LONG),
    ("ERROR 12-04 [base_worker.py:1261] NIXL transfer failure: transfer_failed | Context: {}",
     log_patterns.KV_TRANSFER_FAILED),
    ("RuntimeError: NIXL compatibility hash mismatch. Local: 1a2b, Remote: 3c4d.",
     log_patterns.KV_HANDSHAKE),
    ("WARNING Recovered from KV load failure: 1 request(s) rescheduled (512 tokens affected).",
     log_patterns.KV_LOAD_FAILED),
    ("prefill http://127.0.0.1:8100: KV lease of 30 s over with 2 hand-offs never pulled",
     log_patterns.KV_EXPIRED),
    ("KV hand-off failed: decode worker http://127.0.0.1:8200 could not use the KV cache",
     log_patterns.KV_HANDOFF_FAILED),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
     log_patterns.ENGINE_DEAD),
    ("ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died unexpectedly (exit code: "
     "-9), shutting down executor.", log_patterns.OOM_KILLED),
    ("RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.",
     log_patterns.ENGINE_DEAD),
    ("OSError: [Errno 98] Address already in use", log_patterns.PORT_IN_USE),
    ("INFO 12-04 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s", None),
])
def test_real_log_lines_are_classified(line: str, kind: str | None) -> None:
    assert log_patterns.classify(line) == kind
    if kind is not None:
        assert any(needle.lower() in line.lower() for needle in log_patterns.NEEDLES)


# ---- the API, the page and the command ---------------------------------------------------------
def test_the_api_answers_the_report_in_its_documented_shape(
        deployment: Deployment, api: APIClient) -> None:
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(restarts=4)
    response = api.get(f"/api/v1/deployments/{deployment.pk}/doctor/")
    assert response.status_code == 200
    data = response.json()
    assert DoctorReportSerializer(data=data).is_valid(), DoctorReportSerializer(data=data).errors
    assert (data["deployment"], data["name"], data["state"]) == (
        deployment.pk, deployment.name, "present")
    assert [s["id"] for s in data["symptoms"]] == list(ORDER)
    restarts = data["symptoms"][ORDER.index("restarts")]
    assert restarts["state"] == "present"
    assert set(restarts["evidence"][0]) == {"text", "source", "at", "url", "strong"}
    assert set(restarts["causes"][0]) == {"id", "text", "score", "fixes"}


def test_the_page_shows_the_symptoms_and_refreshes_in_place(
        deployment: Deployment, owner: User) -> None:
    client = Client()
    client.force_login(owner)
    detail = client.get(f"/deployments/{deployment.name}/")
    assert f'href="/deployments/{deployment.name}/doctor/"' in detail.content.decode()
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(restarts=4)
    page = client.get(f"/deployments/{deployment.name}/doctor/").content.decode()
    assert f'data-refresh-url="/deployments/{deployment.name}/doctor/?partial=1"' in page
    assert 'id="restarts" data-symptom="restarts" data-state="present"' in page
    assert 'id="queueing" data-symptom="queueing" data-state="not_seen"' in page
    partial = client.get(f"/deployments/{deployment.name}/doctor/?partial=1").content.decode()
    assert "<html" not in partial and 'data-state="present"' in partial


def test_the_command_prints_the_report_and_fails_when_a_symptom_is_present(
        deployment: Deployment) -> None:
    out = StringIO()
    call_command("doctor", deployment.name, stdout=out)
    assert f"{deployment.name}: not seen" in out.getvalue()
    assert "[ not seen] Workers restart often (#restarts)" in out.getvalue()

    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").update(
        restarts=4, exit_code=1, ready_at=None, state=State.FAILED)
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("doctor", str(deployment.pk), stdout=out)
    assert raised.value.returncode == 1
    assert "present: restarts" in str(raised.value)
    text = out.getvalue()
    assert "[  PRESENT] Workers restart often (#restarts)" in text
    assert "    - process" in text and "1. the worker exits during its start" in text
    assert f"fix: read its log, then correct the plan [/deployments/{deployment.name}/#processes]" \
        in text
    with pytest.raises(CommandError, match="no deployment 'nope'"):
        call_command("doctor", "nope")


def test_the_command_prints_json(deployment: Deployment) -> None:
    out = StringIO()
    call_command("doctor", deployment.name, "--json", stdout=out)
    assert '"state": "not_seen"' in out.getvalue()


# ---- alerts link to their symptom -----------------------------------------------------------------
def test_an_alert_page_and_its_email_link_to_the_symptom(
        deployment: Deployment, owner: User) -> None:
    alert = fire(deployment, "handoff_failures", "0.2 of KV hand-offs failed")
    client = Client()
    client.force_login(owner)
    page = client.get(f"/alerts/{alert.pk}/").content.decode()
    assert f'href="/deployments/{deployment.name}/doctor/#kv-transfer-timeout"' in page
    payload = {"status": "firing", "externalURL": "https://pdserve.example",
               "groupLabels": {"alertname": alert.labels["alertname"]},
               "alerts": [{"status": "firing", "labels": alert.labels, "annotations": {},
                           "startsAt": "2026-12-04T21:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
                           "generatorURL": f"https://pdserve.example/alerts/{alert.pk}/"}]}
    assert (f"Troubleshoot: https://pdserve.example/deployments/{deployment.name}/doctor/"
            "#kv-transfer-timeout") in body(payload)


def test_a_custom_rule_links_by_its_series() -> None:
    labels = {"deployment": "d", "series": "worker.tpot_p95", "alertname": "Mine"}
    assert symptom_links.doctor_path_of(labels) == "/deployments/d/doctor/#stalls"
    assert symptom_links.doctor_path_of({"deployment": "d", "series": "process.cpu"}) == \
        "/deployments/d/doctor/"


# ---- the rules are pure: observations built by hand ------------------------------------------------
def _plan(**values: Any) -> Plan:
    fields: dict[str, Any] = {
        "name": "p", "mode": "pd", "running": True, "kv_channel": "nixl",
        "kv_load_failure": "recompute", "max_model_len": 2048, "concurrency": 4,
        "kv_cache_gib": 1, "ttft_slo_s": 2.0, "tpot_slo_s": 0.2, "pd_policy": "pd_adaptive",
        "decode_policy": "round_robin", "prefill_policy": "least_outstanding",
        "workers": (PlannedWorker("prefill-0", "prefill", "bf16", "/m/bf16", False),
                    PlannedWorker("decode-0", "decode", "bf16", "/m/bf16", False),
                    PlannedWorker("decode-1", "decode", "bf16", "/m/bf16", False))}
    return Plan(**{**fields, **values})


def test_nothing_observed_is_nothing_seen() -> None:
    diagnoses = examine(Observations(plan=_plan(), now=timezone.now()))
    assert [d.state for d in diagnoses] == [SymptomState.NOT_SEEN] * len(ORDER)
    assert worst(diagnoses) == SymptomState.NOT_SEEN


def test_one_decode_queueing_while_the_other_idles_blames_the_routing_policy() -> None:
    now = timezone.now()
    points = tuple(Sample(now - timedelta(seconds=age), {
        "decode-0": {"role": "decode", "up": 1, "running": 4, "waiting": 5},
        "decode-1": {"role": "decode", "up": 1, "running": 1, "waiting": 0}})
        for age in range(40, -1, -1))
    queueing = RULES["queueing"](Observations(plan=_plan(), now=now, samples=points))
    assert queueing.state == SymptomState.PRESENT
    assert [c.id for c in queueing.causes][:2] == ["capacity", "imbalance"]
    [fix] = queueing.causes[1].fixes
    assert (fix.target, fix.text) == (
        "plan:decode_policy", "route decode by least outstanding requests (now round_robin)")


def test_a_kv_channel_already_recomputing_is_not_told_to_recompute() -> None:
    hit = LogHit("decode-0", 7, timezone.now(), "NIXL transfer failure: transfer_failed | {}",
                 log_patterns.KV_TRANSFER_FAILED, "/x")
    kv = RULES["kv-transfer-timeout"](Observations(plan=_plan(), now=timezone.now(),
                                                   logs=(hit,)))
    assert kv.state == SymptomState.PRESENT
    assert [f.target for f in kv.causes[0].fixes] == ["plan:kv_channel"]
