"""Mixed prefill/decode load: one server versus naive PD versus pd_adaptive, side by side.

The workload of the facts note (../shared/notes/vllm-cpu-facts.md), driven by vLLM's own
benchmark client (`vllm bench serve`, run from its module because the `vllm` CLI cannot find
the `vllm-cpu` distribution's metadata):

- decode-only: 64-token prompts, 128 tokens out, 8 at a time -> output tokens/s;
- mixed: a prefill-heavy stream (1,024 in / 16 out, Poisson 0.4 req/s) and a decode-heavy
  stream (64 in / 128 out, Poisson 0.75 req/s) at once -> TTFT and ITL p50/p99 of each.

Configurations, one after another so they never share the cores:
- one server on both cores;
- PD 1P1D (prefill on core 0, decode on core 1, shared-storage KV on /dev/shm) behind
  two routers on the same workers: "naive" sends every prompt through prefill, first come
  first served; "pd_adaptive" decides per request (inference/router/adaptive.py).

    .venv/bin/python bench/pd_mixed.py --model data/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import serve_client  # noqa: E402
from bench.pd_serving import require_free_ports, start, stop, wait_ready  # noqa: E402
from inference.launch import WorkerSpec, build_command  # noqa: E402

SINGLE_PORT, PREFILL_PORT, DECODE_PORT = 8320, 8120, 8220
NAIVE_PORT, ADAPTIVE_PORT = 8091, 8092
SERVED = "smollm2"
def client(url: str, args: argparse.Namespace, out: Path, *, input_len: int, output_len: int,
           num_prompts: int, seed: int, rate: float | None = None,
           concurrency: int | None = None) -> subprocess.Popen[bytes]:
    return serve_client.start(url, SERVED, args.model, serve_client.Workload(
        input_len, output_len, num_prompts, seed, rate, concurrency), out)


finish = serve_client.finish


def warm_up(url: str) -> None:
    body = {"model": SERVED, "prompt": "Warm-up: " + "the ledger " * 300, "max_tokens": 4}
    httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()
    body["prompt"] = "Hi"
    httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()


def run_load(name: str, url: str, args: argparse.Namespace, workdir: Path,
             seed: int) -> dict[str, Any]:
    print(f"[pd_mixed] {name}: warm-up, decode-only, then {args.duration:.0f} s of mixed load",
          flush=True)
    warm_up(url)
    decode_only = finish(client(url, args, workdir / f"{name}-decode-only.json", input_len=64,
                                output_len=128, num_prompts=48, concurrency=8, seed=seed),
                         workdir / f"{name}-decode-only.json")
    heavy_out, light_out = workdir / f"{name}-prefill-heavy.json", workdir / f"{name}-decode-heavy.json"
    heavy = client(url, args, heavy_out, input_len=1024, output_len=16, rate=0.4,
                   num_prompts=max(1, round(0.4 * args.duration)), seed=seed + 1)
    light = client(url, args, light_out, input_len=64, output_len=128, rate=0.75,
                   num_prompts=max(1, round(0.75 * args.duration)), seed=seed + 2)
    return {"decode_only": decode_only, "prefill_heavy": finish(heavy, heavy_out),
            "decode_heavy": finish(light, light_out)}


def worker(role: str, port: int, cores: tuple[int, ...], args: argparse.Namespace,
           workdir: Path, kv_dir: Path | None) -> subprocess.Popen[bytes]:
    argv, env = build_command(WorkerSpec(
        role=role, model_path=args.model, served_model_name=SERVED, port=port,
        max_model_len=2048, kv_channel="shared-storage" if kv_dir else None,
        kv_storage_path=str(kv_dir) if kv_dir else None, cpu_cores=cores, dtype=args.dtype,
        sampling_defaults={"temperature": 0.0}, cache_dir=str(workdir / "cache"),
    ))
    return start(argv, env, workdir / f"{role}.log")


def router(port: int, extra: list[str], args: argparse.Namespace,
           workdir: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "inference.router", "--served-model-name", SERVED,
            "--tokenizer", args.model, "--max-model-len", "2048",
            "--kv-channel", "shared-storage", "--port", str(port),
            "--prefill", f"http://127.0.0.1:{PREFILL_PORT}",
            "--decode", f"http://127.0.0.1:{DECODE_PORT}", *extra]
    return start(argv, {}, workdir / f"router-{port}.log")


def placements(url: str) -> str:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts = []
    for line in text.splitlines():
        if line.startswith("pdserve_router_pd_placements_total{"):
            labels, value = line.rsplit(" ", 1)
            where = labels.split('placement="')[1].split('"')[0]
            counts.append(f"{where} {float(value):.0f}")
    return ", ".join(counts)


def row(name: str, result: dict[str, Any], reference: dict[str, Any] | None) -> str:
    light, heavy = result["decode_heavy"], result["prefill_heavy"]
    tok_s = result["decode_only"]["output_throughput"]

    def ratio(value: float, key: tuple[str, str]) -> str:
        if reference is None:
            return ""
        base = reference[key[0]][key[1]]
        return f" ({value / base:.2f}x)" if base else ""

    return (f"| {name} | {light['median_ttft_ms']:.0f}"
            f"{ratio(light['median_ttft_ms'], ('decode_heavy', 'median_ttft_ms'))} / "
            f"{light['p99_ttft_ms']:.0f} | {light['median_itl_ms']:.0f} / "
            f"{light['p99_itl_ms']:.0f}{ratio(light['p99_itl_ms'], ('decode_heavy', 'p99_itl_ms'))} | "
            f"{heavy['median_ttft_ms']:.0f} / {heavy['p99_ttft_ms']:.0f} | "
            f"{tok_s:.0f}{ratio(tok_s, ('decode_only', 'output_throughput'))} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--dtype", default="bfloat16",
                        help="worker dtype; the workload's rates were set for bf16 on this machine "
                             "(float32 serves about a third as fast, and the mixed load would "
                             "overload every configuration)")
    parser.add_argument("--duration", type=float, default=90.0,
                        help="seconds of mixed load per configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="keep logs and results here (default: a temp dir)")
    args = parser.parse_args()
    # A plain `kill` must still stop the workers (the `finally` blocks below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.model = str(Path(args.model).resolve())
    require_free_ports(SINGLE_PORT, PREFILL_PORT, DECODE_PORT, NAIVE_PORT, ADAPTIVE_PORT)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pd-mixed-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    decisions = ""

    processes = [worker("colocated", SINGLE_PORT, (0, 1), args, workdir, None)]
    try:
        wait_ready(f"http://127.0.0.1:{SINGLE_PORT}")
        results["one server, cores 0+1"] = run_load("single", f"http://127.0.0.1:{SINGLE_PORT}",
                                                    args, workdir, args.seed)
    finally:
        stop(processes)

    kv_dir = Path(tempfile.mkdtemp(prefix="pd-mixed-kv-", dir="/dev/shm"))
    processes = [worker("prefill", PREFILL_PORT, (0,), args, workdir, kv_dir),
                 worker("decode", DECODE_PORT, (1,), args, workdir, kv_dir)]
    try:
        processes.append(router(NAIVE_PORT, ["--pd-policy", "remote",
                                             "--local-prefill-max-tokens", "0"], args, workdir))
        processes.append(router(ADAPTIVE_PORT, ["--pd-policy", "pd_adaptive",
                                                "--local-prefill-max-tokens", "128"], args, workdir))
        for port in (NAIVE_PORT, ADAPTIVE_PORT):
            wait_ready(f"http://127.0.0.1:{port}")
        # Different seeds: the same prompts again would hit the workers' prefix cache.
        results["PD 1P1D, naive (all through prefill)"] = run_load(
            "naive", f"http://127.0.0.1:{NAIVE_PORT}", args, workdir, args.seed + 100)
        results["PD 1P1D, pd_adaptive"] = run_load(
            "adaptive", f"http://127.0.0.1:{ADAPTIVE_PORT}", args, workdir, args.seed + 200)
        decisions = placements(f"http://127.0.0.1:{ADAPTIVE_PORT}")
    finally:
        stop(processes)
        shutil.rmtree(kv_dir, ignore_errors=True)

    reference = results["one server, cores 0+1"]
    print(f"\nSmolLM2-135M ({args.dtype}), {args.duration:.0f} s of mixed load, vLLM's bench client; "
          "ratios against one server")
    print("| configuration | decode-heavy TTFT p50 / p99 ms | decode-heavy ITL p50 / p99 ms | "
          "prefill-heavy TTFT p50 / p99 ms | decode-only tok/s (64/128, conc. 8) |")
    print("|---|---|---|---|---|")
    for name, result in results.items():
        print(row(name, result, None if result is reference else reference))
    print(f"\npd_adaptive placements: {decisions}")
    print(f"logs and raw results: {workdir}")
    (workdir / "summary.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
