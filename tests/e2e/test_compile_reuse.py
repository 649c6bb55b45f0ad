"""A compiled worker's second start reuses what its first compiled (issue 25): started twice with
one cache directory, as the supervisor restarts a worker or starts a rollout's green one, the
second start logs no recompilation and adds nothing to inductor's caches (every graph was a
hit). The tiny model, compiled (tests/conftest.py makes the suite's workers eager; this one
is not), from an empty cache: about a minute for both starts on this CPU."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx

from inference.child_env import child_environment
from inference.launch import WorkerSpec, build_command
from inference.output_gate import free_port
from inference.process_groups import stop_group
from tests.borrowed import SMOLLM2
from tests.tiny_llama import shared_tiny_llama

RECOMPILED = "Compiling model again"


def start_once(cache: Path, log: Path, extra: tuple[str, ...] = ()) -> str:
    """Start a compiled tiny worker until /health answers, stop it, return its log."""
    port = free_port()
    argv, env = build_command(WorkerSpec(
        role="colocated", model_path=str(shared_tiny_llama(SMOLLM2)), served_model_name="tiny",
        port=port, max_model_len=512, dtype="float32", cache_dir=str(cache),
        enforce_eager=False, extra_args=extra))
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, env=child_environment(env, dict(os.environ)),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 400
            while True:
                assert process.poll() is None, log.read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, "the worker was not healthy in 400 s"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        finally:
            stop_group(process)
    return log.read_text(errors="replace")


def entries(cache: Path) -> set[str]:
    """Inductor's cached graphs, wherever under ``cache`` (vLLM's AOT compile moved them)."""
    return {str(p.relative_to(cache)) for kind in ("fxgraph", "aotautograd")
            for tree in cache.rglob(kind) for p in tree.rglob("*") if p.is_file()}


def test_a_second_start_of_a_compiled_worker_compiles_nothing_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = start_once(cache, tmp_path / "first.log")
    compiled = entries(cache)
    assert compiled, f"the first start cached no compiled graph:\n{first[-3000:]}"
    # A rollout's green worker: the same model with another --max-num-seqs.
    second = start_once(cache, tmp_path / "second.log", ("--max-num-seqs", "8"))
    assert RECOMPILED not in second
    assert entries(cache) == compiled, "the second start compiled a graph the first had cached"
    assert not (cache / "vllm" / "torch_compile_cache" / "torch_aot_compile").exists()
