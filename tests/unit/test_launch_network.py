"""A worker's addresses and NIXL's transport follow the address its node is reached at: vLLM's
--host and VLLM_HOST_IP, NIXL's side channel, and UCX's devices (the interface holding the
address, found on the machine the command is built on) and transports (GPU memory on CUDA).

The machine's interfaces are stubbed at psutil.net_if_addrs, its RDMA devices with a sysfs tree."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import psutil
import pytest

from inference import net_devices
from inference.launch import WorkerSpec, build_command
from tests.node_interfaces import NODE_A_INTERFACES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def on_node_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This machine as node A; yields its (empty) /sys/class/infiniband."""
    sysfs = tmp_path / "infiniband"
    sysfs.mkdir()
    monkeypatch.setattr(net_devices, "SYS_INFINIBAND", sysfs)
    with mock.patch.object(psutil, "net_if_addrs", autospec=True, return_value=NODE_A_INTERFACES):
        yield sysfs


def rdma_port(sysfs: Path, device: str, port: int, state: str) -> None:
    path = sysfs / device / "ports" / str(port)
    path.mkdir(parents=True)
    (path / "state").write_text(f"{state}\n")


def spec(**overrides: Any) -> WorkerSpec:
    settings: dict[str, Any] = {
        "role": "prefill", "model_path": "/models/tiny", "served_model_name": "tiny",
        "port": 8100, "max_model_len": 2048, "kv_channel": "nixl", "side_channel_port": 5600,
    }
    return WorkerSpec(**{**settings, **overrides})


def value_of(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def test_a_loopback_cpu_worker_keeps_ucx_on_lo_over_tcp() -> None:
    argv, env = build_command(spec())
    assert value_of(argv, "--host") == "127.0.0.1"
    assert env["UCX_NET_DEVICES"] == "lo"
    assert env["UCX_TLS"] == "tcp,self,sm"
    assert json.loads(value_of(argv, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"


def test_a_gpu_worker_moves_kv_from_gpu_memory_over_cuda_transports() -> None:
    argv, env = build_command(spec(gpu_indices=(0, 1)))
    assert json.loads(value_of(argv, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
    transports = env["UCX_TLS"].split(",")
    assert {"cuda_copy", "cuda_ipc", "rc"} <= set(transports)
    # TCP stays a fallback, not the only choice.
    assert "tcp" in transports and transports != ["tcp"]
    assert env["UCX_NET_DEVICES"] == "lo"


def test_a_worker_on_its_nodes_address_binds_and_advertises_it(on_node_a: Path) -> None:
    argv, env = build_command(spec(host="10.0.0.1", side_channel_port=5601))
    assert value_of(argv, "--host") == "10.0.0.1"
    assert env["VLLM_HOST_IP"] == "10.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    # The interface holding the address: not lo, not the docker bridge.
    assert env["UCX_NET_DEVICES"] == "ens5"
    assert env["UCX_TLS"] == "tcp,self,sm"
    assert "0.0.0.0" not in argv and "0.0.0.0" not in env.values()


def test_a_gpu_worker_may_also_use_the_nodes_active_rdma_ports(on_node_a: Path) -> None:
    rdma_port(on_node_a, "mlx5_1", 1, "4: ACTIVE")
    rdma_port(on_node_a, "mlx5_0", 1, "4: ACTIVE")
    rdma_port(on_node_a, "mlx5_2", 1, "1: DOWN")
    _argv, env = build_command(spec(host="10.0.0.1", gpu_indices=(0, 1, 2, 3)))
    assert env["UCX_NET_DEVICES"] == "ens5,mlx5_0:1,mlx5_1:1"
    # A CPU worker's transports are TCP and shared memory: RDMA ports would go unused.
    _argv, env = build_command(spec(host="10.0.0.1"))
    assert env["UCX_NET_DEVICES"] == "ens5"


def test_an_ipv6_address_finds_its_interface(on_node_a: Path) -> None:
    _argv, env = build_command(spec(host="fe80::a"))
    assert env["UCX_NET_DEVICES"] == "ens5"


def test_a_command_built_off_the_node_leaves_the_devices_to_ucx(on_node_a: Path) -> None:
    # Node B's worker, its command built on node A (or on the console's machine).
    argv, env = build_command(spec(host="10.0.0.2", gpu_indices=(0,)))
    assert value_of(argv, "--host") == "10.0.0.2"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    assert "UCX_NET_DEVICES" not in env
    # So does a placeholder the Kubernetes export puts in the address's place.
    _argv, env = build_command(spec(host="$(POD_IP)"))
    assert "UCX_NET_DEVICES" not in env


def test_the_launch_cli_takes_the_address() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inference.launch", "--role", "decode", "--model", "/models/tiny",
         "--kv-channel", "nixl", "--side-channel-port", "5602", "--host", "10.0.0.9",
         "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert value_of(words, "--host") == "10.0.0.9"
    assert {"VLLM_HOST_IP=10.0.0.9", "VLLM_NIXL_SIDE_CHANNEL_HOST=10.0.0.9"} <= set(words)


def test_a_worker_whose_kv_peers_are_on_other_nodes_leaves_shared_memory_out() -> None:
    """Shared memory reaches no other machine, and UCX would take it between nodes that share
    a kernel (namespaces, containers): the KV would bypass the network the plan names."""
    spec = WorkerSpec(role="decode", model_path="/m", served_model_name="m", port=8200,
                      max_model_len=512, kv_channel="nixl", side_channel_port=5601)
    _argv, same_node = build_command(spec)
    assert same_node["UCX_TLS"] == "tcp,self,sm"
    _argv, remote = build_command(WorkerSpec(**{**spec.__dict__, "remote_peers": True}))
    assert remote["UCX_TLS"] == "tcp,self"
    _argv, gpu = build_command(WorkerSpec(**{**spec.__dict__, "remote_peers": True,
                                             "gpu_indices": (0,)}))
    assert "sm" not in gpu["UCX_TLS"].split(",") and "cuda_ipc" not in gpu["UCX_TLS"]
