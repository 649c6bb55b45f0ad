"""Worker launch specs become the right ``vllm serve`` command lines, and KV channel upkeep."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from inference.kv_channels import SharedStorageChannel, make_channel, uses_transfer_params
from inference.launch import (
    COMPILE_CACHE_ENV,
    ENGINE_PROCESS_ENV,
    VLLM_SERVER_MODULE,
    LaunchError,
    WorkerSpec,
    build_command,
    engine_process_env,
)

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = "/models/tiny-instruct"


def spec(**overrides: Any) -> WorkerSpec:
    settings: dict[str, Any] = {
        "role": "prefill",
        "model_path": MODEL_DIR,
        "served_model_name": "tiny",
        "port": 8100,
        "max_model_len": 2048,
        "kv_channel": "nixl",
        "side_channel_port": 5600,
    }
    settings.update(overrides)
    return WorkerSpec(**settings)


def value_of(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def test_command_carries_the_basic_serving_flags() -> None:
    argv, _env = build_command(spec(), python="/opt/venv/bin/python")
    assert argv[:3] == ["/opt/venv/bin/python", "-m", VLLM_SERVER_MODULE]
    assert value_of(argv, "--model") == MODEL_DIR
    assert value_of(argv, "--served-model-name") == "tiny"
    assert value_of(argv, "--port") == "8100"
    assert value_of(argv, "--max-model-len") == "2048"
    # Workers are reached only through the router; they must not listen on other interfaces.
    assert value_of(argv, "--host") == "127.0.0.1"


@pytest.mark.parametrize(("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_nixl_transfer_config_and_environment(role: str, kv_role: str) -> None:
    argv, env = build_command(spec(role=role, side_channel_port=5601))
    config = json.loads(value_of(argv, "--kv-transfer-config"))
    assert config["kv_connector"] == "NixlConnector"
    assert config["kv_role"] == kv_role
    assert "kv_connector_extra_config" not in config
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["UCX_NET_DEVICES"] == "lo"
    assert "tcp" in env["UCX_TLS"].split(",")
    # Chunked prefill is only a problem for the shared-storage connector.
    assert "--no-enable-chunked-prefill" not in argv


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_decode_gets_the_kv_load_failure_policy_and_prefill_does_not(policy: str) -> None:
    argv, _env = build_command(spec(role="decode", side_channel_port=5601, kv_load_failure=policy))
    assert json.loads(value_of(argv, "--kv-transfer-config"))["kv_load_failure_policy"] == policy
    argv, _env = build_command(spec(role="prefill", kv_load_failure=policy))
    assert "kv_load_failure_policy" not in json.loads(value_of(argv, "--kv-transfer-config"))


def test_nixl_handshake_compat_can_be_relaxed() -> None:
    argv, _env = build_command(spec(enforce_handshake_compat=False))
    config = json.loads(value_of(argv, "--kv-transfer-config"))
    assert config["kv_connector_extra_config"] == {"enforce_handshake_compat": False}


@pytest.mark.parametrize(("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")])
def test_shared_storage_transfer_config(tmp_path: Path, role: str, kv_role: str) -> None:
    argv, env = build_command(spec(role=role, kv_channel="shared-storage", side_channel_port=None,
                                   kv_storage_path=str(tmp_path / "kv")))
    config = json.loads(value_of(argv, "--kv-transfer-config"))
    assert config == {
        "kv_connector": "PdserveSharedStorageConnector",
        "kv_connector_module_path": "inference.kv_connectors.shared_storage",
        "kv_role": kv_role,
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "kv")},
        **({"kv_load_failure_policy": "fail"} if role == "decode" else {}),
    }
    assert not any(key.startswith(("UCX_", "VLLM_NIXL_")) for key in env)


def test_shared_storage_prefill_takes_each_prompt_in_one_step(tmp_path: Path) -> None:
    argv, _env = build_command(spec(kv_channel="shared-storage", side_channel_port=None,
                                    kv_storage_path=str(tmp_path), max_model_len=3072))
    assert "--no-enable-chunked-prefill" in argv
    assert value_of(argv, "--max-num-batched-tokens") == "3072"

    decode_argv, _env = build_command(spec(role="decode", kv_channel="shared-storage",
                                           side_channel_port=None, kv_storage_path=str(tmp_path)))
    assert "--no-enable-chunked-prefill" not in decode_argv
    assert "--max-num-batched-tokens" not in decode_argv


def test_colocated_worker_has_no_kv_connector() -> None:
    argv, env = build_command(spec(role="colocated", kv_channel=None, side_channel_port=None))
    assert "--kv-transfer-config" not in argv
    assert not any(key.startswith(("UCX_", "VLLM_NIXL_")) for key in env)


def test_cpu_cores_are_bound_for_cpu_workers() -> None:
    _argv, env = build_command(spec(cpu_cores=(2, 3), kv_cache_gib=4))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    # The model runs in the engine core (no third interpreter), its OpenMP threads on the
    # worker's cores as vLLM's own worker process would bind them.
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert (env["OMP_NUM_THREADS"], env["OMP_PLACES"], env["OMP_PROC_BIND"]) == ("2", "{2,3}", "true")
    # What the bench drops to measure vLLM's layout is what is set here, no more, no less.
    assert set(engine_process_env((2, 3))) == {"VLLM_CPU_OMP_THREADS_BIND", *ENGINE_PROCESS_ENV}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_gpu_indices_select_devices_and_drop_cpu_settings() -> None:
    _argv, env = build_command(spec(gpu_indices=(1, 0), cpu_cores=(2, 3)))
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert not {"VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_PLACES"} & set(env)
    assert "VLLM_TARGET_DEVICE" not in env


def test_a_worker_on_several_gpus_runs_tensor_parallel_over_them() -> None:
    argv, env = build_command(spec(gpu_indices=(4, 5, 6, 7)))
    assert value_of(argv, "--tensor-parallel-size") == "4"
    # One process per GPU on this machine, never Ray's executor or placement.
    assert value_of(argv, "--distributed-executor-backend") == "mp"
    assert "--pipeline-parallel-size" not in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_a_single_gpu_worker_is_tensor_parallel_one_and_a_cpu_worker_has_no_flags() -> None:
    argv, _env = build_command(spec(gpu_indices=(3,)))
    assert value_of(argv, "--tensor-parallel-size") == "1"
    assert "--distributed-executor-backend" not in argv
    argv, _env = build_command(spec(cpu_cores=(0, 1)))
    assert not {"--tensor-parallel-size", "--distributed-executor-backend"} & set(argv)


def test_pipeline_stages_on_several_machines_run_on_ray() -> None:
    argv, env = build_command(spec(gpu_indices=(0, 1), pipeline_parallel_size=2))
    assert value_of(argv, "--tensor-parallel-size") == "2"
    assert value_of(argv, "--pipeline-parallel-size") == "2"
    assert value_of(argv, "--distributed-executor-backend") == "ray"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_parallel_flags_come_before_extra_args() -> None:
    argv, _env = build_command(spec(gpu_indices=(0, 1), extra_args=("--max-num-seqs", "4")))
    assert argv[-6:] == ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp",
                         "--max-num-seqs", "4"]


def test_workers_never_reach_a_model_hub() -> None:
    _argv, env = build_command(spec())
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["TRANSFORMERS_OFFLINE"] == "1"


def test_enforce_eager_is_vllms_flag_and_off_by_default() -> None:
    assert "--enforce-eager" not in build_command(spec())[0]
    assert "--enforce-eager" in build_command(spec(enforce_eager=True))[0]


def test_workers_of_a_node_share_one_compile_cache_whatever_their_port_role_or_flags() -> None:
    """A restart, the other role and a rollout's green worker (other ports, other
    --max-num-seqs) find what an earlier start compiled: nothing per process in the paths."""
    names = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", *COMPILE_CACHE_ENV)
    variants = [spec(cache_dir="/var/cache/pdserve"),
                spec(cache_dir="/var/cache/pdserve", role="decode", port=8200,
                     side_channel_port=5601, cpu_cores=(1,)),
                spec(cache_dir="/var/cache/pdserve", port=8300, side_channel_port=5602,
                     extra_args=("--max-num-seqs", "64"))]
    envs = [{name: build_command(s)[1][name] for name in names} for s in variants]
    assert envs == [envs[0]] * 3
    assert envs[0] == {"VLLM_CACHE_ROOT": "/var/cache/pdserve/vllm",
                       "TORCHINDUCTOR_CACHE_DIR": "/var/cache/pdserve/inductor",
                       "XDG_CACHE_HOME": "/var/cache/pdserve", "VLLM_USE_AOT_COMPILE": "0"}


def test_vllms_aot_compile_is_off_for_compiled_cpu_workers_only() -> None:
    # On the CPU its cache never loads (inference/launch.py); on CUDA it loads and stays on;
    # an eager worker compiles nothing.
    assert build_command(spec())[1]["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in build_command(spec(enforce_eager=True))[1]
    assert "VLLM_USE_AOT_COMPILE" not in build_command(spec(gpu_indices=(0,)))[1]


def test_extra_args_come_last_so_they_can_override() -> None:
    argv, _env = build_command(spec(extra_args=("--max-num-seqs", "4")))
    assert argv[-2:] == ["--max-num-seqs", "4"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"model_path": "data/models/tiny"}, "model_path"),
        ({"kv_channel": "rdma"}, "kv_channel"),
        ({"side_channel_port": None}, "side_channel_port"),
        ({"side_channel_port": 70000}, "side_channel_port"),
        ({"kv_channel": "shared-storage", "side_channel_port": None}, "kv_storage_path"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"role": "router"}, "role"),
        ({"role": "colocated"}, "kv_channel"),
        ({"kv_channel": None}, "kv_channel"),
        ({"kv_load_failure": "retry"}, "kv_load_failure"),
        ({"gpu_indices": (0, 1, 0)}, "gpu_indices"),
        ({"gpu_indices": (-1,)}, "gpu_indices"),
        ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size"),
        ({"gpu_indices": (0, 1), "extra_args": ("--tensor-parallel-size", "4")}, "extra_args"),
        ({"extra_args": ("-tp=2",)}, "extra_args"),
        ({"extra_args": ("--distributed-executor-backend", "ray")}, "extra_args"),
    ],
)
def test_invalid_specs_raise_launch_error_naming_the_field(overrides: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(LaunchError, match=rf"^{field}:"):
        build_command(spec(**overrides))


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("module", ["inference.launch", "inference.router"])
def test_cli_help_exits_zero(module: str) -> None:
    result = run_module(module, "--help")
    assert result.returncode == 0, result.stderr
    assert f"python -m {module}" in result.stdout


def test_launch_dry_run_prints_the_command(tmp_path: Path) -> None:
    result = run_module(
        "inference.launch", "--role", "prefill", "--model", MODEL_DIR, "--served-model-name", "tiny",
        "--port", "8123", "--cores", "0,1", "--kv-channel", "shared-storage",
        "--kv-storage-path", str(tmp_path), "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert "VLLM_CPU_OMP_THREADS_BIND=0,1" in words
    assert VLLM_SERVER_MODULE in words
    assert value_of(words, "--model") == MODEL_DIR
    assert value_of(words, "--port") == "8123"
    config = json.loads(value_of(words, "--kv-transfer-config"))
    assert config["kv_connector_extra_config"] == {"shared_storage_path": str(tmp_path)}


def test_launch_dry_run_from_a_spec_file(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec(role="decode", port=8201, side_channel_port=5700).to_json())
    result = run_module("inference.launch", "--spec", str(spec_file), "--dry-run")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5700" in words
    assert value_of(words, "--port") == "8201"
    assert json.loads(value_of(words, "--kv-transfer-config"))["kv_role"] == "kv_consumer"


def test_launch_cli_reports_a_bad_spec_as_a_usage_error() -> None:
    result = run_module("inference.launch", "--role", "prefill", "--model", MODEL_DIR,
                        "--kv-channel", "nixl", "--dry-run")
    assert result.returncode == 2
    assert "side_channel_port" in result.stderr
    assert "Traceback" not in result.stderr


def test_sweep_removes_only_entries_older_than_retention(tmp_path: Path) -> None:
    channel = SharedStorageChannel(path=tmp_path, retention_s=300)
    now = time.time()
    ages = {"old-dir": 1000, "old-file": 400, "young-dir": 10, "young-file": 299}
    for name, age in ages.items():
        entry = tmp_path / name
        if name.endswith("dir"):
            entry.mkdir()
            (entry / "layer0.safetensors").write_bytes(b"kv")
        else:
            entry.write_bytes(b"kv")
        os.utime(entry, (now - age, now - age))

    assert channel.sweep(now=now) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["young-dir", "young-file"]
    assert (tmp_path / "young-dir" / "layer0.safetensors").exists()
    # A later sweep removes what has aged past the retention since.
    assert channel.sweep(now=now + 5) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["young-dir"]


def test_sweep_of_a_missing_directory_removes_nothing(tmp_path: Path) -> None:
    assert SharedStorageChannel(path=tmp_path / "absent").sweep() == 0


def test_prepare_empties_the_storage_directory(tmp_path: Path) -> None:
    channel = SharedStorageChannel(path=tmp_path / "kv")
    (tmp_path / "kv" / "stale").mkdir(parents=True)
    channel.prepare()
    assert channel.path.is_dir()
    assert list(channel.path.iterdir()) == []


def test_channel_registry() -> None:
    assert uses_transfer_params("nixl") is True
    assert uses_transfer_params("shared-storage") is False
    with pytest.raises(ValueError, match="rdma"):
        uses_transfer_params("rdma")
    with pytest.raises(ValueError, match="storage path"):
        make_channel("shared-storage")
    channel = make_channel("nixl", enforce_handshake_compat=False)
    assert dataclasses.asdict(channel) == {"enforce_handshake_compat": False}
