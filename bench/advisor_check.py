"""Is the topology advisor right on this machine? Its predictions against measured goodput.

Issue 29 item 5. Two load mixes, one pair of SLOs; ``inference.advisor`` ranks every topology of
two cores (speeds measured here, as the console measures them), then each mix is served on every
candidate and measured with vLLM's benchmark client:
- "decode-heavy": 96 in / 128 out, Poisson 1.3 req/s. Colocated should win: PD's one decode
  core carries every stream while its prefill core idles;
- "documents+stream": 1,024 in / 16 out (0.4 req/s) beside a latency-sensitive stream of short
  answers (64 in / 32 out, 0.75 req/s). PD should win: a colocated server's long prefills stall
  the stream, and over 32 tokens one stall is a large share of a request's TPOT.
SLOs: TTFT 2 s (the console's plan default), TPOT 60 ms (at the plan's 200 ms PD cannot win on
two cores: stalls spread over an answer never break it before queueing breaks TTFT). Goodput,
vLLM's definition: requests meeting both (TPOT = (latency - TTFT) / (output tokens - 1)) per
second from the first request sent to the last answer, over all the mix's streams. Candidates,
SmolLM2 bf16, one core per server, as simulated: colocated x1 (core 0) and x2 (cores 0, 1)
behind pdserve's router (least_outstanding); PD 1P:1D (prefill core 0, decode core 1,
shared-storage KV on /dev/shm, every prompt through prefill: ``--pd-policy remote
--local-prefill-max-tokens 0``).

    .venv/bin/python bench/advisor_check.py                           # about 20-30 minutes
    .venv/bin/python bench/advisor_check.py --speeds S --predict-only  # tune the mixes first
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import serve_client  # noqa: E402
from bench.pd_mixed import warm_up  # noqa: E402
from bench.pd_serving import require_free_ports, start, stop, wait_ready  # noqa: E402
from inference.advisor.candidates import Ranked, rank  # noqa: E402
from inference.advisor.cli import table  # noqa: E402
from inference.advisor.goodput import Slo  # noqa: E402
from inference.advisor.load import profile_from_json  # noqa: E402
from inference.advisor.speeds import load_speeds  # noqa: E402
from inference.launch import WorkerSpec, build_command  # noqa: E402

SERVED = "smollm2"  # bench.pd_mixed.warm_up asks for this name
MAX_MODEL_LEN = 2048
# Clear of bench/pd_mixed.py's and pd_serving.py's ports and the console's 8000/8080/8090.
COLOCATED_PORTS, PREFILL_PORT, DECODE_PORT = (8340, 8341), 8140, 8240
ROUTER_PORTS = {"colocated x1": 8096, "colocated x2": 8097, "PD 1P:1D": 8098}
WITHIN = 0.95


@dataclass(frozen=True)
class Stream:
    name: str
    input_len: int
    output_len: int
    rate: float

    def requests(self, duration_s: float) -> int:
        return max(1, round(self.rate * duration_s))


@dataclass(frozen=True)
class Mix:
    name: str
    streams: tuple[Stream, ...]

    def load_json(self, duration_s: float) -> dict[str, Any]:
        """The advisor's load profile of the same streams the clients send."""
        return {"streams": [{"name": s.name, "rate_per_s": s.rate, "requests": s.requests(duration_s),
                             "prompt_tokens": s.input_len, "output_tokens": s.output_len}
                            for s in self.streams]}


def percentiles(values: list[float]) -> tuple[float, float]:
    p50, p90 = np.percentile(np.asarray(values) * 1000, [50, 90]) if values else (np.nan, np.nan)
    return float(p50), float(p90)


def measured_summary(results: list[dict[str, Any]], slo: Slo) -> dict[str, Any]:
    """Goodput and percentiles over all streams' requests, from vLLM bench's detailed results.
    Its start_times are time.perf_counter(), CLOCK_MONOTONIC on Linux: one clock for all the
    clients, so the span runs from the first request sent to the last answer, as simulated."""
    requests = sum(len(r["start_times"]) for r in results)
    starts = [s for r in results for s in r["start_times"] if s > 0]  # 0: never sent
    ends: list[float] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    good = 0
    for result in results:
        for start_s, ttft, latency, out, error in zip(
                result["start_times"], result["ttfts"], result["latencies"], result["output_lens"],
                result["errors"], strict=True):
            if error or not out:  # failed: vLLM records output length 0
                continue
            ends.append(start_s + latency)
            ttfts.append(ttft)
            tpot = (latency - ttft) / (out - 1) if out > 1 else None
            tpots += [] if tpot is None else [tpot]
            # A one-token answer meets any TPOT SLO, as in vLLM's goodput and the advisor's.
            good += ttft * 1000 <= slo.ttft_ms and (tpot is None or tpot * 1000 <= slo.tpot_ms)
    span = max(ends) - min(starts) if ends else 0.0
    return {"goodput_rps": good / span if span > 0 else 0.0, "attained": good / max(requests, 1),
            "requests": requests, "failed": requests - len(ttfts), "span_s": span,
            "stream_start_offsets_s": [min(r["start_times"]) - min(starts, default=0) for r in results],
            "ttft_ms": percentiles(ttfts), "tpot_ms": percentiles(tpots)}


def start_client(url: str, stream: Stream, requests: int, seed: int, slo: Slo,
                 args: argparse.Namespace, out: Path) -> subprocess.Popen[bytes]:
    """serve_client.start's command plus --save-detailed (per-request TTFTs, latencies and
    output lengths) and vLLM's own per-stream goodput; in a session of its own for stop()."""
    backend, endpoint = serve_client.ENDPOINTS["completions"]
    argv = [sys.executable, "-c", serve_client.CLIENT, "--backend", backend, "--base-url", url,
            "--endpoint", endpoint, "--model", SERVED, "--tokenizer", args.model,
            "--dataset-name", "random", "--random-input-len", str(stream.input_len),
            "--random-output-len", str(stream.output_len), "--random-range-ratio", "0",
            "--num-prompts", str(requests), "--ignore-eos", "--seed", str(seed),
            "--request-rate", str(stream.rate), "--percentile-metrics", "ttft,tpot,itl",
            "--metric-percentiles", "50,90", "--goodput", f"ttft:{slo.ttft_ms:g}",
            f"tpot:{slo.tpot_ms:g}", "--ready-check-timeout-sec", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
                                 "PATH": "/usr/bin:/bin"})


def run_mix(url: str, mix: Mix, slo: Slo, args: argparse.Namespace, out_dir: Path,
            seed: int) -> dict[str, Any]:
    print(f"[advisor_check] {out_dir.name}, {mix.name}: {args.duration:.0f} s of load", flush=True)
    warm_up(url)
    warm_up(url)  # least_outstanding alternates ties: both colocated servers get warmed
    outs = [out_dir / f"{mix.name}-{s.name}.json" for s in mix.streams]
    # Distinct seeds per run and stream: random prompts the prefix cache has never seen.
    clients = [start_client(url, s, s.requests(args.duration), seed + i, slo, args, out)
               for i, (s, out) in enumerate(zip(mix.streams, outs, strict=True))]
    try:
        results = [serve_client.result(c, out, timeout_s=3 * args.duration + 900)
                   for c, out in zip(clients, outs, strict=True)]
    finally:
        stop(clients)
    return measured_summary(results, slo)


def worker(role: str, port: int, core: int, args: argparse.Namespace, workdir: Path,
           kv_dir: Path | None = None) -> subprocess.Popen[bytes]:
    argv, env = build_command(WorkerSpec(
        role=role, model_path=args.model, served_model_name=SERVED, port=port,
        max_model_len=MAX_MODEL_LEN, kv_channel="shared-storage" if kv_dir else None,
        kv_storage_path=str(kv_dir) if kv_dir else None, cpu_cores=(core,), dtype=args.dtype,
        sampling_defaults={"temperature": 0.0}, cache_dir=str(args.cache_dir),
        enforce_eager=args.enforce_eager))
    return start(argv, env, workdir / f"{role}-{port}.log")


def router(label: str, backends: list[str], args: argparse.Namespace,
           workdir: Path) -> subprocess.Popen[bytes]:
    port = ROUTER_PORTS[label]
    argv = [sys.executable, "-m", "inference.router", "--served-model-name", SERVED,
            "--tokenizer", args.model, "--max-model-len", str(MAX_MODEL_LEN), "--port", str(port)]
    if label.startswith("PD"):
        argv += ["--kv-channel", "shared-storage", "--prefill", backends[0], "--decode", backends[1],
                 "--pd-policy", "remote", "--local-prefill-max-tokens", "0"]
    else:
        argv += [a for url in backends for a in ("--colocated", url)]
        argv += ["--colocated-policy", "least_outstanding"]
    return start(argv, {}, workdir / f"router-{port}.log")


def measure_speeds(url: str, neighbour: str, args: argparse.Namespace, workdir: Path,
                   processes: list[subprocess.Popen[bytes]]) -> Path:
    """The console's measurement (the CLI's default grid) on one colocated server of one core,
    with the second server on the other core as its neighbour."""
    print("[advisor_check] measuring speeds with `python -m inference.advisor measure`", flush=True)
    kv_dir = Path(tempfile.mkdtemp(prefix="advisor-check-measure-", dir="/dev/shm"))
    # K and V of every layer for one token, as console/advisor/speed_runs.py computes it.
    c = json.loads((Path(args.model) / "config.json").read_text())
    kv_bytes = (2 * c["num_hidden_layers"] * (c.get("num_key_value_heads") or c["num_attention_heads"])
                * (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
                * (4 if args.dtype == "float32" else 2))
    log = workdir / "measure.log"
    argv = [sys.executable, "-m", "inference.advisor", "measure", "--url", url, "--kv-dir",
            str(kv_dir), "--kv-bytes-per-token", str(kv_bytes), "--neighbour-url", neighbour]
    processes.append(start(argv, {"PYTHONPATH": str(REPO)}, log))
    try:
        processes[-1].wait(timeout=1800)
    finally:
        shutil.rmtree(kv_dir, ignore_errors=True)
    results = [json.loads(line) for line in log.read_text().splitlines()
               if line.startswith('{"event": "result"')]
    if not results:
        sys.exit(f"the speed measurement failed; see {log}")
    path = workdir / "speeds.json"
    path.write_text(json.dumps({"devices_per_server": 1, **results[-1]["speeds"]}, indent=1))
    return path


def predict(all_mixes: list[Mix], speeds_path: Path, slo: Slo, args: argparse.Namespace,
            workdir: Path) -> dict[str, list[Ranked]]:
    speeds = load_speeds(speeds_path)
    if speeds.devices_per_server != 1:
        sys.exit(f"{speeds_path}: devices_per_server must be 1 here (one core per server)")
    seeds = list(range(args.seed, args.seed + args.advisor_seeds))
    ranked = {}
    for mix in all_mixes:
        load = mix.load_json(args.duration)
        (workdir / f"load-{mix.name}.json").write_text(json.dumps(load, indent=1))
        ranked[mix.name] = rank(profile_from_json(load), speeds, slo, devices=2, seeds=seeds)
        print(f"\nadvisor, {mix.name} ({speeds_path}, {len(seeds)} seeds):")
        print(table(ranked[mix.name], len(seeds)))
    return ranked


def report(mix: Mix, ranked: list[Ranked], measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def pair(values: tuple[float, ...]) -> str:
        return f"{values[0]:.0f} / {values[1]:.0f}"

    print(f"\n### {mix.name}: " + "; ".join(f"{s.name} {s.input_len} in / {s.output_len} out at "
                                            f"{s.rate:g} req/s" for s in mix.streams))
    print("| candidate | predicted goodput req/s | measured goodput req/s | SLO met pred / meas | "
          "predicted TTFT p50/p90 ms | measured TTFT p50/p90 ms | predicted TPOT p50/p90 ms | "
          "measured TPOT p50/p90 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ranked:
        m = measured[r.topology.label]
        print(f"| {r.topology.label} | {r.summary.goodput_rps:.3f} | {m['goodput_rps']:.3f} | "
              f"{r.summary.attained:.0%} / {m['attained']:.0%} | {pair(r.summary.ttft_ms)} | "
              f"{pair(m['ttft_ms'])} | {pair(r.summary.tpot_ms)} | {pair(m['tpot_ms'])} |")
    pick = ranked[0].topology.label
    best = max(measured, key=lambda label: measured[label]["goodput_rps"])
    top = measured[best]["goodput_rps"]
    ratio = measured[pick]["goodput_rps"] / top if top > 0 else 1.0
    print(f"\nadvisor's pick: {pick}; measured best: {best}; pick within 5% of the best: "
          f"{'yes' if ratio >= WITHIN else 'no'} ({ratio:.3f} of its goodput)")
    if ranked[1].summary.goodput_rps >= WITHIN * ranked[0].summary.goodput_rps:
        print(f"note: the advisor predicts {ranked[1].topology.label} within 5% of {pick}; "
              "this mix hardly separates them (tune its rates with --predict-only)")
    if (late := max(max(m["stream_start_offsets_s"]) for m in measured.values())) > 2:
        print(f"note: a stream's client started up to {late:.1f} s after the other's")
    return {"streams": [vars(s) for s in mix.streams], "pick": pick,
            "measured_best": best, "ratio": ratio, "within_5pct": ratio >= WITHIN,
            "candidates": {r.topology.label: {"predicted": vars(r.summary) | {
                "goodput_by_seed": r.goodput_by_seed, "best_in": r.best_in},
                "measured": measured[r.topology.label]} for r in ranked}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "data/models/smollm2-135m-instruct"))
    parser.add_argument("--dtype", default="bfloat16", help="the mixes' rates were set for bf16")
    parser.add_argument("--duration", type=float, default=75.0, help="seconds of arrivals per run")
    parser.add_argument("--decode-rate", type=float, default=1.3, help="decode-heavy, req/s")
    parser.add_argument("--documents-rate", type=float, default=0.4, help="1,024-token prompts, req/s")
    parser.add_argument("--stream-rate", type=float, default=0.75, help="the 64/32 stream, req/s")
    parser.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    parser.add_argument("--tpot-slo-ms", type=float, default=60.0)
    parser.add_argument("--speeds", type=Path, help="reuse this speeds.json instead of measuring")
    parser.add_argument("--predict-only", action="store_true",
                        help="print the advisor's ranking of each mix (needs --speeds) and stop")
    parser.add_argument("--advisor-seeds", type=int, default=3, help="as the console (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--enforce-eager", action="store_true", help="ready sooner, slower steps")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "data/cache",
                        help="compiled work every start reuses (default: the console's)")
    parser.add_argument("--workdir", type=Path, help="results and logs (default: a temp dir)")
    args = parser.parse_args()
    if args.predict_only and args.speeds is None:
        parser.error("--predict-only needs --speeds")
    # A plain `kill` must still stop the workers (the `finally` blocks below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.model = str(Path(args.model).resolve())
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="advisor-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    slo = Slo(args.ttft_slo_ms, args.tpot_slo_ms)
    all_mixes = [Mix("decode-heavy", (Stream("chat", 96, 128, args.decode_rate),)),
                 Mix("documents+stream", (Stream("documents", 1024, 16, args.documents_rate),
                                            Stream("stream", 64, 32, args.stream_rate)))]
    if args.predict_only:
        predict(all_mixes, args.speeds, slo, args, workdir)
        return 0
    require_free_ports(*COLOCATED_PORTS, PREFILL_PORT, DECODE_PORT, *ROUTER_PORTS.values())
    measured: dict[str, dict[str, dict[str, Any]]] = {m.name: {} for m in all_mixes}

    def run_candidate(label: str, backends: list[str], index: int,
                      processes: list[subprocess.Popen[bytes]]) -> None:
        processes.append(router(label, backends, args, workdir))
        url = f"http://127.0.0.1:{ROUTER_PORTS[label]}"
        wait_ready(url)
        time.sleep(3)  # /health says 200 once one worker is probed (PD: "degraded"): probe all
        out_dir = workdir / label.replace(" ", "-").replace(":", "")
        out_dir.mkdir(exist_ok=True)
        for m, mix in enumerate(all_mixes):
            measured[mix.name][label] = run_mix(url, mix, slo, args, out_dir,
                                                args.seed + 100 * index + 10 * m)
            # Kept as it goes: a run that dies later still leaves the candidates measured.
            (workdir / "measured.json").write_text(json.dumps(measured, indent=1))

    # Both colocated candidates share the two servers: colocated x1 routes to the first only
    # (the second idles on its core), which also serves the speed measurement.
    urls = [f"http://127.0.0.1:{p}" for p in COLOCATED_PORTS]
    processes = [worker("colocated", port, core, args, workdir) for core, port in enumerate(COLOCATED_PORTS)]
    try:
        for url in urls:
            wait_ready(url, timeout_s=900)
        speeds_path = args.speeds or measure_speeds(urls[0], urls[1], args, workdir, processes)
        ranked = predict(all_mixes, speeds_path, slo, args, workdir)
        run_candidate("colocated x1", urls[:1], 1, processes)
        run_candidate("colocated x2", urls, 2, processes)
    finally:
        stop(processes)

    kv_dir = Path(tempfile.mkdtemp(prefix="advisor-check-kv-", dir="/dev/shm"))
    processes = [worker("prefill", PREFILL_PORT, 0, args, workdir, kv_dir),
                 worker("decode", DECODE_PORT, 1, args, workdir, kv_dir)]
    try:
        for port in (PREFILL_PORT, DECODE_PORT):
            wait_ready(f"http://127.0.0.1:{port}", timeout_s=900)
        run_candidate("PD 1P:1D", [f"http://127.0.0.1:{p}" for p in (PREFILL_PORT, DECODE_PORT)], 3,
                      processes)
    finally:
        stop(processes)
        shutil.rmtree(kv_dir, ignore_errors=True)

    print(f"\nSmolLM2-135M ({args.dtype}{', eager' if args.enforce_eager else ''}), one core per "
          f"server, {args.duration:.0f} s of arrivals per run; SLOs TTFT <= {slo.ttft_ms:g} ms, "
          f"TPOT <= {slo.tpot_ms:g} ms; predicted over {args.advisor_seeds} seeds, measured once")
    summary = {"slo": vars(slo), "duration_s": args.duration, "speeds": str(speeds_path),
               "mixes": {m.name: report(m, ranked[m.name], measured[m.name]) for m in all_mixes}}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nraw results, logs and summary.json: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
