"""Quantized variants on this machine: bf16, W8A8-int8, W4A16 and the mixed PD pair
(W8A8 prefill + W4A16 decode), side by side.

    .venv/bin/python bench/quant.py --model data/models/smollm2-135m-instruct

Builds the two quantized variants with the variant builder (``.venv-quant``, GPTQ, timed) unless
they exist under ``--work``, then serves one configuration at a time (each holds the shared heavy
lock only while its servers run) and prints one table:

- prefill ms for 512 and 1,024 prompt tokens (median of 3, no prefix-cache hit; for the pair: the
  first token through the router, prefill + KV hand-off + decode's first step);
- decode tok/s at 1 stream and at 16 concurrent streams (128 tokens each, ``ignore_eos``);
- perplexity on ``bench/perplexity.txt`` (teacher-forced ``prompt_logprobs``);
- agreement with bf16: teacher-forced top-1 agreement on bf16's greedy answers to the gate's 8
  prompts, and the share of bf16's greedy tokens reproduced before the first difference;
- RSS per worker (process tree); build time of each variant.

A single variant runs on one core (core 1), as a plan's worker does; the pair has prefill on
core 0 and decode on core 1, shared-storage KV and the router with ``--pd-policy remote``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.pd_serving import rss_mb, stop, tree, wait_ready  # noqa: E402
from inference.launch import WorkerSpec, build_command  # noqa: E402
from inference.output_gate import (  # noqa: E402
    ReferenceAnswer,
    ReferenceServer,
    free_port,
    load_prompts,
    reference_answers,
    running_server,
    score_candidate,
    served_model,
    token_logprobs,
)
from inference.variant_speed import decode_tps, prefill_ms, prompt_ids, warm_up  # noqa: E402

LOCK = Path("/tmp/pdserve-heavy.lock")
TEXT = REPO / "bench" / "perplexity.txt"
ANSWER_TOKENS = 16
DECODE_TOKENS = 128
VARIANTS = {"w8a8": ("w8a8-int8", []), "w4a16": ("w4a16", ["--group-size", "64"])}


@contextmanager
def heavy_lock() -> Iterator[None]:
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(model: Path, work: Path, name: str, quant_python: str) -> tuple[Path, float | None]:
    """The variant's directory and its build time (recorded next to it when it was built)."""
    out = work / name
    times_file = work / "build-times.json"
    times = json.loads(times_file.read_text()) if times_file.is_file() else {}
    if (out / "config.json").is_file():
        return out, times.get(name)
    scheme, extra = VARIANTS[name]
    argv = [quant_python, "-m", "inference.quantize", "--model", str(model), "--out", str(out),
            "--scheme", scheme, "--method", "gptq", *extra]
    print(f"building {name}: {' '.join(argv)}", file=sys.stderr)
    with heavy_lock():
        started = time.perf_counter()
        subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        elapsed = time.perf_counter() - started
    times[name] = round(elapsed, 1)
    times_file.write_text(json.dumps(times, indent=2))
    return out, elapsed


def concurrent_tps(url: str, model: str, streams: int, tokens: int = DECODE_TOKENS) -> float:
    """Generated tokens per second with ``streams`` requests in flight at once."""
    counts: list[int] = []
    errors: list[str] = []

    def one(index: int) -> None:
        body = {"model": model, "prompt": f"Story number {index}: once upon a time",
                "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
        if response.status_code != 200:
            errors.append(response.text[:200])
            return
        counts.append(int(response.json()["usage"]["completion_tokens"]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} of {streams} streams failed: {errors[0]}")
    return sum(counts) / elapsed


def ttft_ms(client: httpx.Client, url: str, model: str, ids: list[int], repeats: int = 3) -> float:
    """Median time to the first streamed token (through the router: prefill + hand-off)."""
    times = []
    for repeat in range(repeats + 1):
        prompt = [ids[(repeat * 7919) % len(ids)], *ids[1:]]
        started = time.perf_counter()
        with client.stream("POST", f"{url}/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    break
        if repeat:
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def perplexity(client: httpx.Client, url: str, model: str) -> float:
    ids = prompt_ids_of_text(client, url, model, TEXT.read_text())
    scored = token_logprobs(client, url, model, ids, 1)
    return math.exp(-sum(lp for lp, _ in scored) / len(scored))


def prompt_ids_of_text(client: httpx.Client, url: str, model: str, text: str) -> list[int]:
    response = client.post(f"{url}/tokenize", json={"model": model, "prompt": text})
    response.raise_for_status()
    return list(response.json()["tokens"])


def greedy_reproduced(client: httpx.Client, url: str, model: str,
                      answers: list[ReferenceAnswer]) -> float:
    """Share of the reference's greedy tokens the server repeats before its first difference."""
    kept = 0
    for answer in answers:
        response = client.post(f"{url}/v1/completions", json={
            "model": model, "prompt": answer.prompt_ids, "max_tokens": len(answer.answer_ids),
            "temperature": 0, "ignore_eos": True, "return_token_ids": True})
        response.raise_for_status()
        tokens = response.json()["choices"][0]["token_ids"]
        for mine, theirs in zip(tokens, answer.answer_ids, strict=False):
            if mine != theirs:
                break
            kept += 1
    return kept / sum(len(a.answer_ids) for a in answers)


@dataclass
class Row:
    name: str
    prefill_512_ms: float
    prefill_1024_ms: float
    decode_1: float
    decode_16: float
    perplexity: float
    agreement: float
    mean_delta: float
    greedy: float
    rss_mb: str
    build_s: float | None


def measure(name: str, url: str, pids: dict[str, int], answers: list[ReferenceAnswer] | None,
            build_s: float | None, via_router: bool = False,
            scoring_url: str | None = None) -> tuple[Row, list[ReferenceAnswer]]:
    with httpx.Client(timeout=600) as client:
        model = served_model(client, url)
        scoring = scoring_url or url
        ids = prompt_ids(client, scoring, served_model(client, scoring), 1024)
        timing = ttft_ms if via_router else prefill_ms
        warm_up(client, url, model)
        p512, p1024 = timing(client, url, model, ids[:512]), timing(client, url, model, ids)
        d1 = decode_tps(client, url, model, DECODE_TOKENS)
        d16 = concurrent_tps(url, model, 16)
        scoring_model = served_model(client, scoring)
        ppl = perplexity(client, scoring, scoring_model)
        if answers is None:
            answers = reference_answers(client, url, load_prompts(8), ANSWER_TOKENS)
        score = score_candidate(client, name, scoring, answers)
        greedy = greedy_reproduced(client, url, model, answers)
    rss = ", ".join(f"{role} {rss_mb(tree(pid)):,.0f}" for role, pid in pids.items())
    return Row(name, p512, p1024, d1, d16, ppl, score.agreement, score.mean_abs_delta, greedy, rss,
               build_s), answers


def single(name: str, path: Path, dtype: str, answers: list[ReferenceAnswer] | None,
           build_s: float | None, logs: Path) -> tuple[Row, list[ReferenceAnswer]]:
    processes: list[subprocess.Popen[bytes]] = []
    with heavy_lock(), running_server(
            ReferenceServer(str(path.resolve()), 0, dtype, cores=(1,), cache_dir=str(logs / "cache")),
            logs / f"{name}.log", started=processes.append) as url:
        return measure(name, url, {"worker": processes[0].pid}, answers, build_s)


def pair(prefill: Path, decode: Path, dtype: str, answers: list[ReferenceAnswer],
         logs: Path) -> Row:
    kv_dir = Path("/dev/shm") / f"pdserve-bench-quant-{os.getpid()}"
    ports = {"prefill": free_port(), "decode": free_port(), "router": free_port()}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    handles = []
    with heavy_lock():
        try:
            for role, path, core in (("prefill", prefill, 0), ("decode", decode, 1)):
                argv, env = build_command(WorkerSpec(
                    role=role, model_path=str(path.resolve()), served_model_name="pair",
                    port=ports[role], max_model_len=2048, kv_channel="shared-storage",
                    kv_storage_path=str(kv_dir), cpu_cores=(core,), dtype=dtype,
                    block_size=128, cache_dir=str(logs / "cache")))
                handle = open(logs / f"pair-{role}.log", "wb")  # noqa: SIM115
                handles.append(handle)
                processes[role] = subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle,
                                                   stderr=subprocess.STDOUT, start_new_session=True)
            handle = open(logs / "pair-router.log", "wb")  # noqa: SIM115
            handles.append(handle)
            processes["router"] = subprocess.Popen(
                [sys.executable, "-m", "inference.router", "--served-model-name", "pair",
                 "--tokenizer", str(decode.resolve()), "--max-model-len", "2048",
                 "--kv-channel", "shared-storage", "--port", str(ports["router"]),
                 "--pd-policy", "remote", "--local-prefill-max-tokens", "128",
                 "--prefill", f"http://127.0.0.1:{ports['prefill']}",
                 "--decode", f"http://127.0.0.1:{ports['decode']}"],
                cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
            for port in ports.values():
                wait_ready(f"http://127.0.0.1:{port}", 420)
            row, _ = measure("W8A8 prefill + W4A16 decode", f"http://127.0.0.1:{ports['router']}",
                             {role: p.pid for role, p in processes.items()}, answers, None,
                             via_router=True, scoring_url=f"http://127.0.0.1:{ports['decode']}")
            return row
        finally:
            stop(list(processes.values()))
            for handle in handles:
                handle.close()
            subprocess.run(["rm", "-rf", str(kv_dir)], check=False)


def table(rows: list[Row]) -> str:
    head = ("| configuration | prefill 512 tok ms | prefill 1,024 tok ms | decode tok/s, 1 stream "
            "| decode tok/s, 16 streams | perplexity | top-1 agreement with bf16 (teacher-forced) "
            "| mean abs Δ logprob | bf16's greedy tokens reproduced | RSS MB per worker | build s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        build = "-" if r.build_s is None else f"{r.build_s:.0f}"
        lines.append(f"| {r.name} | {r.prefill_512_ms:,.0f} | {r.prefill_1024_ms:,.0f} | "
                     f"{r.decode_1:.1f} | {r.decode_16:.1f} | {r.perplexity:.2f} | {r.agreement:.1%} | "
                     f"{r.mean_delta:.3f} | {r.greedy:.1%} | {r.rss_mb} | {build} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "data/models/smollm2-135m-instruct")
    parser.add_argument("--work", type=Path, default=REPO / "data/bench/quant",
                        help="where the variants are built (kept for the next run)")
    parser.add_argument("--dtype", default="bfloat16", help="compute dtype of every server")
    parser.add_argument("--quant-python", default=str(REPO / ".venv-quant/bin/python"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        parser.error(f"--model: no config.json in {args.model}")
    if not Path(args.quant_python).is_file():
        parser.error(f"--quant-python: {args.quant_python} does not exist (make install creates it)")
    args.work.mkdir(parents=True, exist_ok=True)
    logs = args.work / "logs"
    logs.mkdir(exist_ok=True)
    built = {name: build(args.model, args.work, name, args.quant_python) for name in VARIANTS}
    rows = []
    base, answers = single("bf16", args.model, args.dtype, None, None, logs)
    rows.append(base)
    for name, label in (("w8a8", "W8A8-int8 (GPTQ + SmoothQuant)"), ("w4a16", "W4A16 (GPTQ, group 64)")):
        path, seconds = built[name]
        rows.append(single(label, path, args.dtype, answers, seconds, logs)[0])
    rows.append(pair(built["w8a8"][0], built["w4a16"][0], args.dtype, answers, logs))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
