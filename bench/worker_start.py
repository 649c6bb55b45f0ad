"""How long a vLLM worker takes to start, and whether it reuses compiled work.

Starts real workers through ``inference.launch.build_command`` (a decode worker of the
shared-storage channel, one core, as the default deployment's), one at a time, and times each
from spawn until ``/health`` answers 200:

- ``cold``: an empty cache directory (torch.compile and inductor from scratch);
- ``warm``: the same configuration again, same cache directory (a restart);
- ``warm-seqs``: the same model with ``--max-num-seqs 64`` (a rollout's green worker);
- ``loaded``: ``warm-seqs`` again while another worker on the other core serves a steady
  stream of requests (``--load``).

for each ``--variant``: ``pdserve`` is the environment build_command gives today;
``three-processes`` the same with vLLM's own process layout on the CPU (API server, engine
core and a worker process for the model, instead of the model in the engine core); ``vllm``
vLLM's defaults for both (AOT compile on, three processes). The tiny model's eager start (what
the tests use) is timed for each variant too. Each start's resident memory, summed over its
processes, is read once it answers.

    flock /tmp/vllm.lock .venv/bin/python bench/worker_start.py --variant vllm --variant pdserve

Each variant gets a fresh cache directory under ``--work`` (kept for inspection). The log lines
that tell compiled work apart (AOT saved / loaded / "Compiling model again", inductor's
cache hits) are counted per start.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from inference.launch import (  # noqa: E402
    COMPILE_CACHE_ENV,
    ENGINE_PROCESS_ENV,
    WorkerSpec,
    build_command,
)

PORT, LOAD_PORT = 8410, 8420
MARKERS = {
    "aot_saved": re.compile(r"saved AOT compiled function"),
    "aot_loaded": re.compile(r"Directly load AOT compilation"),
    "recompiled": re.compile(r"Compiling model again due to a load failure"),
}
ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


@dataclass
class Start:
    variant: str
    scenario: str
    seconds: float
    engine_init_s: float | None
    markers: dict[str, int]
    processes: int
    resident_gib: float


def spec_for(model: Path, cache: Path, kv_dir: Path, port: int, core: int,
             extra: tuple[str, ...] = (), eager: bool = False) -> WorkerSpec:
    return WorkerSpec(role="decode", model_path=str(model), served_model_name="bench",
                      port=port, max_model_len=2048, kv_channel="shared-storage",
                      kv_storage_path=str(kv_dir), cpu_cores=(core,), cache_dir=str(cache),
                      enforce_eager=eager, sampling_defaults={"temperature": 0.0},
                      extra_args=extra)


def environment(variant: str, env: dict[str, str]) -> dict[str, str]:
    dropped: tuple[str, ...] = ()
    if variant == "vllm":
        # pdserve's cache roots only; vLLM chooses how to compile and how many processes.
        dropped = COMPILE_CACHE_ENV + ENGINE_PROCESS_ENV
    elif variant == "three-processes":
        dropped = ENGINE_PROCESS_ENV
    return {k: v for k, v in env.items() if k not in dropped}


def launch(spec: WorkerSpec, variant: str, log: Path) -> subprocess.Popen[bytes]:
    argv, env = build_command(spec)
    env = environment(variant, env)
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("VLLM_", "TORCHINDUCTOR_", "OMP_"))}
    full.update(env, VLLM_API_KEY="bench")
    handle = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(argv, env=full, stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_ready(process: subprocess.Popen[bytes], port: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"worker on {port} exited with {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"worker on {port} not ready after {timeout_s} s")


def timed_start(spec: WorkerSpec, variant: str, scenario: str, log: Path,
                timeout_s: float) -> Start:
    process = launch(spec, variant, log)
    try:
        seconds = wait_ready(process, spec.port, timeout_s)
        # vLLM's resource tracker is a process too; it holds a few MB.
        server = psutil.Process(process.pid)
        tree = [server, *server.children(recursive=True)]
        resident = sum(p.memory_info().rss for p in tree) / 2**30
    finally:
        stop(process)
    text = log.read_text(errors="replace")
    init = ENGINE_INIT.search(text)
    return Start(variant, scenario, seconds, float(init.group(1)) if init else None,
                 {name: len(pattern.findall(text)) for name, pattern in MARKERS.items()},
                 len(tree), resident)


class Load:
    """A steady stream of short chat-free completions at one worker (``concurrency`` at once)."""

    def __init__(self, port: int, concurrency: int = 4) -> None:
        self.port, self.concurrency = port, concurrency
        self.done = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(concurrency)]

    def _run(self) -> None:
        body = {"model": "bench", "prompt": "Count slowly from one to fifty:", "max_tokens": 64}
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                try:
                    client.post(f"http://127.0.0.1:{self.port}/v1/completions", json=body,
                                headers={"Authorization": "Bearer bench"})
                    self.done += 1
                except httpx.HTTPError:
                    time.sleep(0.5)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=130)


def run_variant(variant: str, args: argparse.Namespace, work: Path) -> list[Start]:
    cache = work / f"cache-{variant}"
    shutil.rmtree(cache, ignore_errors=True)
    kv_dir = work / "kv"
    kv_dir.mkdir(exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    base = spec_for(args.model, cache, kv_dir, PORT, core=0)
    seqs = spec_for(args.model, cache, kv_dir, PORT, core=0, extra=("--max-num-seqs", "64"))
    results = []
    for scenario, spec in (("cold", base), ("warm", base), ("warm-seqs", seqs)):
        if scenario not in args.scenario:
            continue
        print(f"[{variant}] {scenario} ...", flush=True)
        results.append(timed_start(spec, variant, scenario,
                                   logs / f"{variant}-{scenario}.log", args.timeout))
        print(f"[{variant}] {scenario}: {results[-1].seconds:.1f} s {results[-1].markers}",
              flush=True)
    if "loaded" in args.scenario:
        # The load server is itself a warm start of the base configuration on the other core.
        load_spec = spec_for(args.model, cache, kv_dir, LOAD_PORT, core=1)
        load_process = launch(load_spec, variant, logs / f"{variant}-load-server.log")
        try:
            wait_ready(load_process, LOAD_PORT, args.timeout)
            with Load(LOAD_PORT) as load:
                time.sleep(5)
                print(f"[{variant}] loaded ...", flush=True)
                seqs_loaded = spec_for(args.model, cache, kv_dir, PORT, core=0,
                                       extra=("--max-num-seqs", "32"))
                results.append(timed_start(seqs_loaded, variant, "loaded",
                                           logs / f"{variant}-loaded.log", args.timeout))
                print(f"[{variant}] loaded: {results[-1].seconds:.1f} s {results[-1].markers}"
                      f" ({load.done} requests served meanwhile)", flush=True)
        finally:
            stop(load_process)
    return results


def tiny_eager(variant: str, args: argparse.Namespace, work: Path) -> Start | None:
    tiny = REPO / "data" / "models" / "tiny-llama-2l"
    if not (tiny / "model.safetensors").is_file():
        print("tiny model not built (tests build data/models/tiny-llama-2l); skipped")
        return None
    cache = work / f"cache-{variant}"
    (work / "logs").mkdir(exist_ok=True)
    (work / "kv").mkdir(exist_ok=True)
    spec = spec_for(tiny, cache, work / "kv", PORT, core=0, eager=True)
    print(f"[{variant}] tiny eager ...", flush=True)
    return timed_start(spec, variant, "tiny, eager",
                       work / "logs" / f"{variant}-tiny-eager.log", args.timeout)


def table(results: list[Start]) -> str:
    lines = ["| variant | start | seconds to /health 200 | engine init s | processes | "
             "resident GiB | AOT saved | AOT loaded | 'Compiling model again' |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        init = f"{r.engine_init_s:.1f}" if r.engine_init_s is not None else "-"
        lines.append(f"| {r.variant} | {r.scenario} | {r.seconds:.1f} | {init} | "
                     f"{r.processes} | {r.resident_gib:.2f} | "
                     f"{r.markers['aot_saved']} | {r.markers['aot_loaded']} | "
                     f"{r.markers['recompiled']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path,
                        default=REPO / "data" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--variant", action="append",
                        choices=("vllm", "three-processes", "pdserve"))
    parser.add_argument("--scenario", action="append",
                        choices=("cold", "warm", "warm-seqs", "loaded"))
    parser.add_argument("--load", action="store_true", help="add the 'loaded' scenario")
    parser.add_argument("--no-tiny", action="store_true")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pdserve-ws")
    args = parser.parse_args()
    args.model = args.model.resolve()
    args.variant = args.variant or ["vllm", "pdserve"]
    args.scenario = args.scenario or ["cold", "warm", "warm-seqs"]
    if args.load and "loaded" not in args.scenario:
        args.scenario.append("loaded")
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for variant in args.variant:
        results += run_variant(variant, args, args.work)
    for variant in [] if args.no_tiny else args.variant:
        tiny = tiny_eager(variant, args, args.work)
        if tiny is not None:
            results.append(tiny)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
