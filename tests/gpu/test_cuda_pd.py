"""The CUDA path for real: a NIXL prefill/decode pair of the default model on GPUs, started from
pdserve's launch specs (the KV cache moving from GPU memory), behind pdserve's router, answers a
greedy request with the tokens a single GPU server gives.

Runs where ``nvidia-smi -L`` lists a GPU (tests/conftest.py skips the ``gpu`` marker elsewhere).
Each server gets a quarter of its GPU, so that one GPU can hold all three."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from console.live.resources import TreeUsage
from inference.launch import WorkerSpec, build_command
from tests.console.sockets import free_port
from tests.tiny_llama import TEST_CACHE_DIR

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR",
                                REPO / "data" / "models" / "smollm2-135m-instruct"))
START_TIMEOUT_S = 600
# Several blocks of 16 tokens (CUDA's block), so that whole blocks move over NIXL.
PROMPT = ("The following is a record of the river towns along the old trade route. "
          + " ".join(f"Town number {i} trades in {('salt', 'wool', 'iron')[i % 3]}." for i in range(1, 25))
          + " Which goods do the towns trade most?")


@dataclass(frozen=True)
class Servers:
    router: str
    reference: str
    logs: Path
    pids: dict[str, int]


def gpu_indices() -> list[int]:
    """The GPUs nvidia-smi lists ("GPU 0: NVIDIA ... (UUID: ...)")."""
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    return [int(line.split()[1].rstrip(":")) for line in listing.stdout.splitlines()
            if line.startswith("GPU ")]


def wait_ok(url: str, process: subprocess.Popen[bytes], ok: str | None = None) -> None:
    """Until ``url`` answers 200 (and, with ``ok``, a JSON status of ``ok``); fails at once if
    the process meant to answer exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url}: its process exited with {process.returncode}"
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200 and (ok is None or response.json()["status"] == ok):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not ready within {START_TIMEOUT_S} s")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if not (MODEL_DIR / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "inference.prepare_model", "--out", str(MODEL_DIR)],
                       cwd=REPO, check=True)
    gpus = gpu_indices()
    logs = tmp_path_factory.mktemp("cuda-pd")
    ports = {name: free_port() for name in ("prefill", "decode", "reference", "router")}
    specs = {
        name: WorkerSpec(
            role=role, model_path=str(MODEL_DIR), served_model_name="smollm2",
            port=ports[name], max_model_len=2048,
            kv_channel=None if role == "colocated" else "nixl",
            side_channel_port=None if role == "colocated" else free_port(),
            gpu_indices=(gpus[index % len(gpus)],), cache_dir=str(TEST_CACHE_DIR),
            enforce_eager=True, extra_args=("--gpu-memory-utilization", "0.25"))
        for index, (name, role) in enumerate((("prefill", "prefill"), ("decode", "decode"),
                                              ("reference", "colocated")))}
    processes: list[subprocess.Popen[bytes]] = []
    handles = []

    def spawn(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        handle = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in teardown
        handles.append(handle)
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(process)
        return process

    try:
        started = {name: spawn(name, *build_command(spec)) for name, spec in specs.items()}
        router = spawn("router", [
            sys.executable, "-m", "inference.router", "--served-model-name", "smollm2",
            "--tokenizer", str(MODEL_DIR), "--max-model-len", "2048", "--kv-channel", "nixl",
            "--port", str(ports["router"]), "--prefill", f"http://127.0.0.1:{ports['prefill']}",
            "--decode", f"http://127.0.0.1:{ports['decode']}", "--local-prefill-max-tokens", "16",
            "--prefix-block-size", "16", "--kv-warmup-tokens", "32"], {"PYTHONUNBUFFERED": "1"})
        for name, process in started.items():
            wait_ok(f"http://127.0.0.1:{ports[name]}/health", process)
        # Ok once its warm-up hand-off went through NIXL.
        wait_ok(f"http://127.0.0.1:{ports['router']}/health", router, ok="ok")
        yield Servers(router=f"http://127.0.0.1:{ports['router']}",
                      reference=f"http://127.0.0.1:{ports['reference']}", logs=logs,
                      pids={name: process.pid for name, process in started.items()})
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        for handle in handles:
            handle.close()


def test_a_nixl_pair_on_gpus_answers_as_a_single_gpu_server(servers: Servers) -> None:
    body = {"model": "smollm2", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "return_token_ids": True}
    pd = httpx.post(f"{servers.router}/v1/completions", json=body, timeout=300,
                    headers={"X-Request-Id": "cuda-pd"})
    assert pd.status_code == 200, pd.text
    # The reference with the prompt cached, as decode has it: its KV computed in one pass.
    httpx.post(f"{servers.reference}/v1/completions", json=body, timeout=120).raise_for_status()
    single = httpx.post(f"{servers.reference}/v1/completions", json=body, timeout=120).json()
    assert pd.json()["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]
    # The hand-off went through NIXL: prefill named its engine and blocks for decode.
    [timeline] = [json.loads("{" + line.split("timeline {", 1)[1])
                  for line in (servers.logs / "router.log").read_text().splitlines()
                  if "cuda-pd" in line and "timeline {" in line]
    assert timeline["kv"]["remote_engine_id"]
    assert timeline["kv"]["remote_num_tokens"] > 16


def test_the_collector_reads_each_workers_gpu_memory_from_the_driver(servers: Servers) -> None:
    """What the verification report's resources section holds against the plan's GPUs: each
    worker tree's memory as the driver lists it (its engine's processes hold it, not the pid
    started), about the 25 % each was given."""
    import pynvml

    pynvml.nvmlInit()
    usage = TreeUsage()
    for name, pid in servers.pids.items():
        held = usage.measure(pid).get("gpu_mem")
        total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(
            gpu_indices()[0])).total
        assert held is not None and 0 < held < 0.5 * total, (name, held, total)
