"""The builder CLI on a tiny random-weight Llama: W8A8 and W4A16 (round to nearest, seconds),
what it writes, a SIGTERM midway, and vLLM serving both with its CPU int8 and W4A16 kernels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from console.catalog.inspection import inspect_model_dir
from inference.cpu_dtype import cpu_flags, has_w4a16_kernel
from inference.launch import WorkerSpec, build_command
from inference.quantization.output import PROVENANCE_FILE, partial_dir
from tests.console.sockets import free_port
from tests.quant.conftest import QUANT_PYTHON, REPO, quantize
from tests.tiny_llama import TEST_CACHE_DIR

VARIANTS = {"w8a8": ("w8a8-int8", "compressed-tensors w8a8", "CPUInt8ScaledMMLinearKernel"),
            "w4a16": ("w4a16", "compressed-tensors w4a16", "CPUWNA16LinearKernel")}


@pytest.fixture(scope="session")
def built(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list]]:
    root = tmp_path_factory.mktemp("built")
    found = {}
    for key, (scheme, _, _) in VARIANTS.items():
        result, events = quantize(tiny_llama, root / key, "--scheme", scheme, "--method", "rtn")
        assert result.returncode == 0, result.stderr[-3000:]
        found[key] = (root / key, events)
    return found


@pytest.mark.parametrize("key", list(VARIANTS))
def test_rtn_writes_a_complete_servable_variant(built: dict[str, tuple[Path, list]], tiny_llama: Path,
                                               key: str) -> None:
    out, events = built[key]
    assert events[-1]["event"] == "done" and events[-1]["path"] == str(out)
    percents = [e["percent"] for e in events]
    assert percents == sorted(percents) and percents[-1] == 100
    assert [e["stage"] for e in events if e["event"] == "progress"][0] == "prepare"
    assert not partial_dir(out).exists()

    variant, source = inspect_model_dir(str(out)), inspect_model_dir(str(tiny_llama))
    assert variant.quantization == VARIANTS[key][1]
    # Same KV geometry and the same tokenizer and chat template, byte for byte: what the
    # pre-flight checks compare between a plan's prefill and decode variants.
    assert (variant.num_layers, variant.num_kv_heads, variant.head_dim, variant.kv_dtype) == (
        source.num_layers, source.num_kv_heads, source.head_dim, source.kv_dtype)
    assert variant.tokenizer_sha256 == source.tokenizer_sha256
    assert variant.chat_template_sha256 == source.chat_template_sha256 != ""
    assert variant.generation_config == source.generation_config
    assert variant.size_bytes < source.size_bytes
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["ignore"] == ["lm_head"]
    provenance = json.loads((out / PROVENANCE_FILE).read_text())
    assert provenance["method"] == "rtn" and provenance["versions"]["llmcompressor"] == "0.14.0.1"


def test_w4a16_records_its_group_size(built: dict[str, tuple[Path, list]]) -> None:
    quant = json.loads((built["w4a16"][0] / "config.json").read_text())["quantization_config"]
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["strategy"], weights["group_size"]) == (4, "group", 64)


def test_a_build_terminated_midway_leaves_nothing(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "w8"
    builder = subprocess.Popen(
        [str(QUANT_PYTHON), "-m", "inference.quantize", "--model", str(tiny_llama), "--out", str(out),
         "--scheme", "w8a8-int8"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert builder.stdout is not None
    for line in builder.stdout:
        if json.loads(line)["stage"] == "load":
            break
    assert partial_dir(out).is_dir()  # it had started writing
    builder.send_signal(signal.SIGTERM)
    rest = builder.stdout.read()
    assert builder.wait(timeout=60) == 143
    assert json.loads(rest.splitlines()[-1]) == {"event": "error", "flag": None,
                                                "error": "terminated; nothing was left behind"}
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def servers(built: dict[str, tuple[Path, list]], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, tuple[str, Path]]]:
    """One vLLM server per variant, one core each, started together."""
    logs_dir = tmp_path_factory.mktemp("vllm-logs")
    started: dict[str, tuple[subprocess.Popen[bytes], str, Path]] = {}
    try:
        servable = [key for key in VARIANTS if key != "w4a16" or has_w4a16_kernel(cpu_flags())]
        for core, key in enumerate(servable):
            port = free_port()
            argv, env = build_command(WorkerSpec(
                role="colocated", model_path=str(built[key][0]), served_model_name=key, port=port,
                max_model_len=512, cpu_cores=(core,), dtype="bfloat16", cache_dir=str(TEST_CACHE_DIR),
                enforce_eager=True))
            log = logs_dir / f"{key}.log"
            with log.open("wb") as handle:
                process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            started[key] = (process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + 420
        for key, (process, url, log) in started.items():
            while True:
                assert process.poll() is None, f"{key} server exited:\n{log.read_text()[-4000:]}"
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"{key} server not ready:\n{log.read_text()[-4000:]}"
                time.sleep(1)
        yield {key: (url, log) for key, (_, url, log) in started.items()}
    finally:
        for process, _, _ in started.values():
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.vllm
@pytest.mark.parametrize("key", [pytest.param(key, marks=[pytest.mark.w4a16_cpu]) if key == "w4a16"
                                 else key for key in VARIANTS])
def test_vllm_serves_the_variant_with_its_cpu_kernel(servers: dict[str, tuple[str, Path]], key: str) -> None:
    url, log = servers[key]
    response = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": key, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
        "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8
    assert VARIANTS[key][2] in log.read_text()
