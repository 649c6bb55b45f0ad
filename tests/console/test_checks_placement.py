"""Checks about where the workers run (devices, ports, memory, NIXL, nodes), the check API, and
start refused while errors stand. Ports are probed for real: tests hold them with real sockets.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.catalog.models import Variant
from console.checks.nixl import handshake_compat_enforced
from console.checks.plan import PlanView
from console.checks.suite import CHECKS, enforce_handshake_compat, run_checks
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node, NodeAgent
from console.fleet.services import local_node
from console.supervisor.models import ManagedProcess
from tests.console.tiny_models import (
    QUANTIZED_W8A8,
    free_port,
    make_plan,
    register,
    run,
    use_variant,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def plan(tmp_path: Path) -> Deployment:
    return make_plan(tmp_path)


@pytest.fixture
def remote(db: None) -> Node:
    return Node.objects.create(name="gpu-b", address="10.0.0.2", cpu_ids=[0, 1, 2, 3],
                               memory_bytes=64 << 30, engine_version=local_node().engine_version,
                               kv_connectors=["PdserveSharedStorageConnector", "NixlConnector"])


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A process (this one) holding a port, as a stray server would."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock
    sock.close()


# ---- device.conflict ------------------------------------------------------------------------


def test_device_conflict_fails_for_a_shared_core_unless_declared(plan: Deployment) -> None:
    prefill_core = plan.workers.get(role="prefill").cpu_cores
    plan.workers.filter(role="decode").update(cpu_cores=prefill_core)
    outcome = run(plan, "device.conflict")
    assert outcome.status == "error"
    node = local_node().name
    assert f"core {prefill_core} on node {node} is used by prefill-0 and decode-0" in \
        outcome.results[0].message
    assert "declare sharing on every worker involved" in outcome.results[0].hint

    plan.workers.update(share_devices=True)
    outcome = run(plan, "device.conflict")
    assert outcome.status == "pass"
    assert "declared shared" in outcome.summary


def test_device_conflict_fails_for_cores_and_gpus_the_node_lacks(plan: Deployment) -> None:
    plan.workers.filter(role="decode").update(cpu_cores="999")
    outcome = run(plan, "device.conflict")
    assert outcome.status == "error"
    assert "core(s) 999, which node" in outcome.results[0].message

    plan.workers.filter(role="decode").update(cpu_cores="", gpu_indices="0")
    assert "GPU(s) 0, which node" in run(plan, "device.conflict").results[0].message

    plan.workers.filter(role="decode").update(cpu_cores=str(local_node().cpu_ids[-1]),
                                              gpu_indices="")
    assert run(plan, "device.conflict").status == "pass"


def test_device_conflict_sees_other_running_deployments(plan: Deployment, tmp_path: Path) -> None:
    other = make_plan(tmp_path, name="other", desired_state=Deployment.DesiredState.RUNNING)
    outcome = run(plan, "device.conflict")
    assert outcome.status == "error"
    assert "of running deployment other" in outcome.results[0].message

    Deployment.objects.filter(pk=other.pk).update(desired_state=Deployment.DesiredState.STOPPED)
    assert run(plan, "device.conflict").status == "pass"


# ---- port.conflict --------------------------------------------------------------------------


def test_port_conflict_fails_for_a_port_planned_twice(plan: Deployment) -> None:
    prefill = plan.workers.get(role="prefill")
    plan.workers.filter(role="decode").update(port=prefill.port)
    outcome = run(plan, "port.conflict")
    assert outcome.status == "error"
    assert f"port {prefill.port} on node" in outcome.results[0].message
    assert "prefill-0 and decode-0" in outcome.results[0].message
    hint = outcome.results[0].hint
    suggested = int(hint.split(" to ")[1].split()[0])

    plan.workers.filter(role="decode").update(port=suggested)
    assert run(plan, "port.conflict").status == "pass"


def test_port_conflict_counts_side_channels_only_for_nixl(plan: Deployment) -> None:
    prefill = plan.workers.get(role="prefill")
    plan.workers.filter(role="decode").update(side_channel_port=prefill.side_channel_port)
    assert run(plan, "port.conflict").status == "pass"  # shared-storage opens no side channel

    Deployment.objects.filter(pk=plan.pk).update(kv_channel="nixl")
    outcome = run(plan, "port.conflict")
    assert outcome.status == "error"
    assert "prefill-0 side channel and decode-0 side channel" in outcome.results[0].message


# ---- port.bound -----------------------------------------------------------------------------


def test_port_bound_names_the_process_holding_a_planned_port(plan: Deployment,
                                                             listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    plan.workers.filter(role="decode").update(port=port)
    outcome = run(plan, "port.bound")
    assert outcome.status == "error"
    assert f"port {port} (decode-0) is already bound by pid {os.getpid()}" in \
        outcome.results[0].message
    assert "change the port of decode-0 to" in outcome.results[0].hint

    listener.close()
    assert run(plan, "port.bound").status == "pass"


def test_port_bound_accepts_the_deployments_own_processes_and_reports_drift(
    plan: Deployment, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    plan.workers.filter(role="decode").update(port=port)
    # The running decode worker is this process, listening on its planned port.
    process = ManagedProcess.objects.create(
        deployment=plan, slot="decode-0", role="decode", port=port, pid=os.getpid(),
        state=ManagedProcess.State.READY, log_path="/nonexistent.log")
    outcome = run(plan, "port.bound")
    assert outcome.status == "pass"
    assert f"held by this deployment's own processes: decode-0 {port}" in outcome.summary

    # The plan was edited while running: the process still has the old port.
    new_port = free_port()
    plan.workers.filter(role="decode").update(port=new_port)
    outcome = run(plan, "port.bound")
    assert outcome.status == "warning"
    assert f"decode-0 runs on port {port}; the plan now says {new_port}" in \
        outcome.results[0].message
    assert "restart the deployment" in outcome.results[0].hint

    # Drift: planned and recorded port agree, but the process listens elsewhere.
    ManagedProcess.objects.filter(pk=process.pk).update(port=new_port)
    outcome = run(plan, "port.bound")
    assert outcome.status == "warning"
    assert f"drift: decode-0 was planned on port {new_port} but listens on" in \
        outcome.results[0].message
    assert str(port) in outcome.results[0].message


# ---- memory.fit -----------------------------------------------------------------------------


def test_memory_fit_fails_when_the_node_is_too_small(plan: Deployment) -> None:
    node = local_node()
    real = node.memory_bytes
    Node.objects.filter(pk=node.pk).update(memory_bytes=4 << 30)
    outcome = run(plan, "memory.fit")
    assert outcome.status == "error"
    message = outcome.results[0].message
    assert f"node {node.name} lacks memory" in message
    assert "1.00 GiB KV cache + 1.50 GiB runtime" in message
    assert "of 3.60 GiB usable (4.00 GiB - 10% headroom)" in message

    Node.objects.filter(pk=node.pk).update(memory_bytes=real)
    assert run(plan, "memory.fit").status == "pass"


def test_memory_fit_shows_the_kv_arithmetic_for_context_times_concurrency(
    plan: Deployment, tmp_path: Path
) -> None:
    # 2 x 64 layers x 64 KV heads x 128 x 2 B = 2 MiB per token: 4 GiB for one 2048-token request.
    big = register(plan.base_model, tmp_path, "big-kv", config={
        "num_hidden_layers": 64, "num_key_value_heads": 64, "num_attention_heads": 64,
        "head_dim": 128})
    use_variant(plan, big)
    outcome = run(plan, "memory.fit")
    assert outcome.status == "error"
    result = outcome.results[0]
    assert "2 x 64 layers x 64 KV heads x head dim 128 x 2 B (bfloat16) = 2048.0 KiB per token" \
        in result.message
    assert "vLLM refuses to start" in result.message
    assert "raise the KV cache size to at least 4 GiB" in result.hint

    Deployment.objects.filter(pk=plan.pk).update(max_model_len=256, concurrency=8)
    outcome = run(plan, "memory.fit")
    assert outcome.status == "warning"
    assert "holds 2 request(s) at full context; the plan wants 8" in outcome.results[0].message

    Deployment.objects.filter(pk=plan.pk).update(concurrency=2)
    outcome = run(plan, "memory.fit")
    assert outcome.status == "pass"
    assert "256 tokens x 2 requests = 1.00 GiB of its 1.00 GiB KV cache" in outcome.summary


# ---- nixl.compat ----------------------------------------------------------------------------


def test_nixl_compat_switches_the_path_check_off_only_when_the_caches_match(
    plan: Deployment, tmp_path: Path
) -> None:
    Deployment.objects.filter(pk=plan.pk).update(kv_channel="nixl")
    assert run(plan, "nixl.compat").status == "pass"
    assert enforce_handshake_compat(plan) is True

    deeper = register(plan.base_model, tmp_path, "deeper-w8a8",
                      config={**QUANTIZED_W8A8, "num_hidden_layers": 3})
    use_variant(plan, deeper)
    outcome = run(plan, "nixl.compat")
    assert outcome.status == "error"
    assert "the handshake check must stay on" in outcome.results[0].message
    assert enforce_handshake_compat(plan) is True

    w8a8 = register(plan.base_model, tmp_path, "w8a8", config=QUANTIZED_W8A8)
    use_variant(plan, w8a8)
    outcome = run(plan, "nixl.compat")
    assert outcome.status == "warning"
    message = outcome.results[0].message
    assert f"decode reads {w8a8.path} (tiny/w8a8)" in message
    assert "switches enforce_handshake_compat off" in message
    assert "because kv.geometry and kv.dtype passed" in message
    assert enforce_handshake_compat(plan) is False


def test_nixl_compat_fails_across_device_kinds(plan: Deployment) -> None:
    Deployment.objects.filter(pk=plan.pk).update(kv_channel="nixl", block_size=128)
    plan.workers.filter(role="prefill").update(gpu_indices="0", cpu_cores="")
    outcome = run(plan, "nixl.compat")
    assert outcome.status == "error"
    assert "attention backend" in outcome.results[0].message
    assert handshake_compat_enforced(PlanView.load(plan)) is True

    plan.workers.filter(role="prefill").update(gpu_indices="", cpu_cores="0")
    assert run(plan, "nixl.compat").status == "pass"


# ---- node.agent -----------------------------------------------------------------------------


def test_node_agent_fails_for_workers_on_a_node_without_agent(plan: Deployment,
                                                              remote: Node) -> None:
    plan.workers.filter(role="decode").update(node=remote)
    outcome = run(plan, "node.agent")
    assert outcome.status == "error"
    assert "decode placed on node gpu-b, where no node agent has run" in outcome.results[0].message
    assert "manage.py agent --node gpu-b" in outcome.results[0].hint

    plan.workers.filter(role="decode").update(node=local_node())
    assert run(plan, "node.agent").status == "pass"


def test_node_agent_passes_once_the_nodes_agent_registered_and_warns_while_it_is_down(
        plan: Deployment, remote: Node) -> None:
    plan.workers.filter(role="decode").update(node=remote)
    agent = NodeAgent.objects.create(node=remote, state="up", state_since=timezone.now(),
                                     seen_at=timezone.now())
    outcome = run(plan, "node.agent")
    assert outcome.status == "pass", outcome.as_dict()
    assert "gpu-b (agent up)" in outcome.summary
    NodeAgent.objects.filter(pk=agent.pk).update(state="down")
    outcome = run(plan, "node.agent")
    assert outcome.status == "warning"
    assert "decode placed on node gpu-b, whose agent is down" in outcome.results[0].message


# ---- where checks run: on demand, before start -----------------------------------------------


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


def test_check_endpoint_returns_the_result_list(api: APIClient, plan: Deployment) -> None:
    plan.workers.filter(role="decode").update(port=plan.workers.get(role="prefill").port)
    response = api.post(f"/api/v1/deployments/{plan.pk}/check")
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False
    [result] = body["results"]
    assert set(result) == {"id", "severity", "message", "hint"}
    assert (result["id"], result["severity"]) == ("port.conflict", "error")
    assert [c["id"] for c in body["checks"]] == [c.id for c in CHECKS]
    assert {c["status"] for c in body["checks"]} == {"pass", "error"}


def test_check_endpoint_with_a_body_checks_the_change_without_saving(api: APIClient,
                                                                     plan: Deployment) -> None:
    response = api.post(f"/api/v1/deployments/{plan.pk}/check", {"max_model_len": 8192},
                        format="json")
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == ["context.length"]
    plan.refresh_from_db()
    assert plan.max_model_len == 2048


def test_start_is_refused_with_409_and_the_list_while_errors_stand(api: APIClient,
                                                                   plan: Deployment) -> None:
    plan.workers.filter(role="decode").update(cpu_cores="999")
    response = api.post(f"/api/v1/deployments/{plan.pk}/start")
    assert response.status_code == 409
    body = response.json()
    assert body["detail"] == "start refused: 1 check(s) failed"
    assert [r["id"] for r in body["results"]] == ["device.conflict"]
    plan.refresh_from_db()
    assert plan.desired_state == Deployment.DesiredState.STOPPED

    plan.workers.filter(role="decode").update(cpu_cores=str(local_node().cpu_ids[-1]))
    response = api.post(f"/api/v1/deployments/{plan.pk}/start")
    assert response.status_code == 202
    assert response.json()["checks"]["ok"] is True


def test_start_is_allowed_with_warnings(api: APIClient, plan: Deployment) -> None:
    Deployment.objects.filter(pk=plan.pk).update(concurrency=4096)  # the KV cache holds fewer
    response = api.post(f"/api/v1/deployments/{plan.pk}/start")
    assert response.status_code == 202
    results = response.json()["checks"]["results"]
    assert {(r["id"], r["severity"]) for r in results} == {("memory.fit", "warning")}
    assert len(results) == 2  # one per worker


def test_the_start_button_shows_the_refusal_on_the_page(owner: User, plan: Deployment) -> None:
    plan.workers.filter(role="decode").update(cpu_cores="999")
    browser = Client()
    browser.force_login(owner)
    response = browser.post(f"/deployments/{plan.name}/start/")
    assert response.status_code == 409
    html = response.content.decode()
    assert 'id="refused"' in html and "start refused: 1 check(s) failed" in html
    assert 'class="check check-error" data-check="device.conflict"' in html
    assert 'class="check check-pass" data-check="port.conflict"' in html
    plan.refresh_from_db()
    assert plan.desired_state == Deployment.DesiredState.STOPPED


# ---- how long the checks take ----------------------------------------------------------------


def test_checks_of_an_eight_instance_plan_take_milliseconds(tmp_path: Path,
                                                            listener: socket.socket) -> None:
    plan = make_plan(tmp_path, name="wide", kv_cache_gib=1)
    variant = Variant.objects.get(name="bf16")
    node = local_node()
    for role in ("prefill", "decode"):
        for index in range(1, 4):
            WorkerPlan.objects.create(deployment=plan, role=role, index=index, variant=variant,
                                      node=node, port=free_port(), side_channel_port=free_port(),
                                      cpu_cores=str(node.cpu_ids[index % len(node.cpu_ids)]),
                                      share_devices=True)
    plan.workers.update(share_devices=True)
    # One planned port is held, so the probe also looks up who holds it.
    plan.workers.filter(role="decode", index=3).update(port=listener.getsockname()[1])
    run_checks(plan)  # warm: the local node's facts are discovered once a minute
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        report = run_checks(plan)
        timings.append(time.perf_counter() - started)
    assert plan.workers.count() == 8
    assert [r.id for r in report.errors] == ["port.bound"]
    print(f"checks of 8 instances: best {min(timings) * 1000:.1f} ms, "
          f"worst {max(timings) * 1000:.1f} ms")
    assert max(timings) < 1.0
