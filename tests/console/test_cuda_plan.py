"""The CUDA path through a plan of two 8-GPU nodes: the GPUs come from NVML (stubbed at pynvml),
prefill runs as two tensor-parallel-4 instances on node a, decode as one tensor-parallel-8
instance on node b, and NIXL goes over the nodes' addresses. What is checked is the processes the
supervisor would run: each worker's argv and environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import psutil
import pynvml
import pytest
from rest_framework.test import APIClient

from console.catalog.models import BaseModel
from console.checks.suite import run_checks
from console.control.worker_specs import ProcessSpec, process_specs
from console.deployments.models import Deployment
from console.fleet import discovery
from console.fleet.models import GIB
from console.fleet.services import local_node
from inference import net_devices
from inference.router.config import build_parser
from tests.console.tiny_models import free_port, register
from tests.node_interfaces import NODE_A_INTERFACES

pytestmark = pytest.mark.django_db

NODES = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}
ALL_EIGHT = "0,1,2,3,4,5,6,7"


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # process_specs writes the router's key file; no RDMA device on the nodes of this test.
    settings.DATA_DIR = tmp_path / "data"
    settings.PDSERVE_KV_DIR = tmp_path / "kv"
    (tmp_path / "infiniband").mkdir()
    monkeypatch.setattr(net_devices, "SYS_INFINIBAND", tmp_path / "infiniband")


@pytest.fixture
def nvml() -> Iterator[dict[str, mock.MagicMock]]:
    """NVML of a machine with eight H100s."""
    with mock.patch.multiple(pynvml, autospec=True, nvmlInit=mock.DEFAULT,
                             nvmlShutdown=mock.DEFAULT, nvmlDeviceGetCount=mock.DEFAULT,
                             nvmlDeviceGetHandleByIndex=mock.DEFAULT, nvmlDeviceGetName=mock.DEFAULT,
                             nvmlDeviceGetUUID=mock.DEFAULT,
                             nvmlDeviceGetMemoryInfo=mock.DEFAULT) as stubs:
        stubs["nvmlDeviceGetCount"].return_value = 8
        stubs["nvmlDeviceGetHandleByIndex"].side_effect = lambda index: index
        stubs["nvmlDeviceGetName"].return_value = "NVIDIA H100 80GB HBM3"
        stubs["nvmlDeviceGetUUID"].side_effect = lambda handle: f"GPU-0000000{handle}"
        stubs["nvmlDeviceGetMemoryInfo"].return_value = SimpleNamespace(total=80 * GIB)
        yield stubs


@pytest.fixture
def plan(api: APIClient, nvml: dict[str, mock.MagicMock], tmp_path: Path) -> Deployment:
    # Each node's inventory as NVML reports it there, entered by hand as nodes without an
    # agent are.
    gpus = [{"index": g.index, "name": g.name, "memory_gib": g.memory_bytes // GIB}
            for g in discovery.gpus()]
    for name, address in NODES.items():
        response = api.post("/api/v1/nodes/", {
            "name": name, "address": address, "cpu_count": 32, "memory_gib": 512,
            "engine_version": local_node().engine_version,
            "kv_connectors": ["NixlConnector"], "gpus": gpus}, format="json")
        assert response.status_code == 201, response.content
    register(BaseModel.objects.create(name="llama"), tmp_path, "bf16", config={
        "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 512, "head_dim": 16})
    response = api.post("/api/v1/deployments/", {
        "name": "cuda-pd", "base_model": "llama", "served_model_name": "llama",
        "kv_channel": "nixl", "max_model_len": 2048, "longest_request": 1024,
        "dtype": "bfloat16", "sampling_defaults": {"temperature": 0},
        "prefill": {"variant": "llama/bf16", "instances": [
            {"node": "gpu-a", "gpu_indices": "0,1,2,3"}, {"node": "gpu-a", "gpu_indices": "4,5,6,7"}]},
        "decode": {"variant": "llama/bf16", "instances": [{"node": "gpu-b", "gpu_indices": ALL_EIGHT}]},
        "router": {"port": free_port()},
    }, format="json")
    assert response.status_code == 201, response.content
    return Deployment.objects.get(name="cuda-pd")


def value_of(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def workers(deployment: Deployment) -> dict[str, ProcessSpec]:
    return {spec.slot: spec for spec in process_specs(deployment) if spec.role != "router"}


def test_nvml_gives_the_nodes_their_eight_gpus(plan: Deployment,
                                               nvml: dict[str, mock.MagicMock]) -> None:
    for worker in plan.workers.select_related("node"):
        node_gpus = worker.node.gpus.order_by("index")
        assert [(g.index, g.name, g.memory_bytes) for g in node_gpus] == [
            (i, "NVIDIA H100 80GB HBM3", 80 * GIB) for i in range(8)]
    # Every NVML session read was closed again.
    assert nvml["nvmlShutdown"].call_count == nvml["nvmlInit"].call_count >= 1


def test_the_plan_passes_the_device_and_parallel_checks(plan: Deployment) -> None:
    outcomes = {o.id: o for o in run_checks(plan).outcomes}
    assert outcomes["device.conflict"].status == "pass", outcomes["device.conflict"].results
    assert outcomes["parallel.tensor"].status == "pass", outcomes["parallel.tensor"].results
    assert outcomes["parallel.tensor"].summary == "prefill: tensor parallel 4; decode: tensor parallel 8"
    assert outcomes["nixl.compat"].status == "pass"


def test_each_worker_runs_tensor_parallel_on_its_own_gpus_at_its_nodes_address(
        plan: Deployment) -> None:
    specs = workers(plan)
    assert set(specs) == {"prefill-0", "prefill-1", "decode-0"}
    planned = {w.slot: w for w in plan.workers.all()}
    expected = {"prefill-0": ("10.0.0.1", "0,1,2,3", "4", "kv_producer"),
                "prefill-1": ("10.0.0.1", "4,5,6,7", "4", "kv_producer"),
                "decode-0": ("10.0.0.2", ALL_EIGHT, "8", "kv_consumer")}
    for slot, (host, gpus, tensor, kv_role) in expected.items():
        argv, env, worker = specs[slot].argv, specs[slot].env, planned[slot]
        assert value_of(argv, "--host") == host
        assert value_of(argv, "--port") == str(worker.port)
        assert value_of(argv, "--tensor-parallel-size") == tensor
        assert value_of(argv, "--distributed-executor-backend") == "mp"
        assert "--pipeline-parallel-size" not in argv
        config = json.loads(value_of(argv, "--kv-transfer-config"))
        assert {key: config[key] for key in ("kv_connector", "kv_role", "kv_buffer_device")} == {
            "kv_connector": "NixlConnector", "kv_role": kv_role, "kv_buffer_device": "cuda"}
        assert env["CUDA_VISIBLE_DEVICES"] == gpus
        assert env["VLLM_HOST_IP"] == env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == host
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(worker.side_channel_port)
        # KV peers on the other node: RDMA and TCP, not GPU or host memory sharing.
        assert {"rc", "tcp"} <= set(env["UCX_TLS"].split(","))
        assert not {"cuda_ipc", "sm"} & set(env["UCX_TLS"].split(","))
        # Built here, on neither node: which interface holds the address is the node's to say.
        assert "UCX_NET_DEVICES" not in env
        assert not {"VLLM_TARGET_DEVICE", "VLLM_CPU_KVCACHE_SPACE",
                    "VLLM_CPU_OMP_THREADS_BIND"} & set(env)
        assert "0.0.0.0" not in argv and "127.0.0.1" not in argv
    # Node a's two instances: disjoint GPUs, and ports of their own on the one address.
    a0, a1 = planned["prefill-0"], planned["prefill-1"]
    assert not set(a0.gpu_tuple()) & set(a1.gpu_tuple())
    assert len({a0.port, a1.port, a0.side_channel_port, a1.side_channel_port}) == 4


def test_the_router_reaches_each_worker_at_its_nodes_address(plan: Deployment) -> None:
    [router] = [spec for spec in process_specs(plan) if spec.role == "router"]
    parsed = build_parser().parse_args(router.argv[3:])
    ports = {w.slot: w.port for w in plan.workers.all()}
    assert parsed.prefill_urls == [f"http://10.0.0.1:{ports['prefill-0']}",
                                   f"http://10.0.0.1:{ports['prefill-1']}"]
    assert parsed.decode_urls == [f"http://10.0.0.2:{ports['decode-0']}"]
    # A CUDA KV block is 16 tokens: the router hands over prompts longer than one.
    assert parsed.local_prefill_max_tokens == 16


def test_built_on_node_a_its_workers_use_the_interface_holding_its_address(
        plan: Deployment) -> None:
    with mock.patch.object(psutil, "net_if_addrs", autospec=True, return_value=NODE_A_INTERFACES):
        specs = workers(plan)
    assert specs["prefill-0"].env["UCX_NET_DEVICES"] == "ens5"
    assert specs["prefill-1"].env["UCX_NET_DEVICES"] == "ens5"
    assert "UCX_NET_DEVICES" not in specs["decode-0"].env
