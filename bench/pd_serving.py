"""PD versus one server on this machine, for each KV channel.

Starts real vLLM workers (one configuration at a time, so they never compete for the cores),
then measures: idle CPU % and RSS of every worker, TTFT of a ~1,000-token prompt, greedy output
equality, and output tokens/s for 1 and 16 concurrent streams.

    .venv/bin/python bench/pd_serving.py --model data/models/smollm2-135m-instruct

Metric definitions follow vLLM's benchmark client (TTFT: first SSE chunk with a non-empty
`choices`; tok/s: completion tokens / wall time of the batch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inference.launch import WorkerSpec, build_command  # noqa: E402

PREFILL_PORT, DECODE_PORT, ROUTER_PORT, SINGLE_PORT = 8110, 8210, 8090, 8310
SIDE_PORTS = (5610, 5611)


@dataclass
class Result:
    name: str
    idle_cpu: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    ttft_ms: list[float] = field(default_factory=list)
    tok_s_1: float = 0.0
    tok_s_16: float = 0.0
    greedy_ids: list[int] = field(default_factory=list)
    start_s: float = 0.0


def long_prompt(tokenizer_dir: str, target: int, nonce: str) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    words = []
    i = 0
    text = nonce
    while len(tokenizer(text)["input_ids"]) < target:
        words.append(f"Item {i} of the ledger records {i * 7 % 97} barrels shipped to port {i % 13}.")
        i += 1
        text = nonce + " " + " ".join(words)
    return text


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def require_free_ports(*ports: int) -> None:
    """Exit naming the holder if any of ``ports`` is taken: its server would answer the
    benchmark's health checks and requests in place of the workers started here."""
    taken = []
    for port in ports:
        with socket.socket() as sock:
            # As servers bind: a port in TIME_WAIT is free, a listening one is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                holders = {f"pid {c.pid} ({' '.join(psutil.Process(c.pid).cmdline()[:4])})"
                           for c in psutil.net_connections("tcp")
                           if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                           and c.pid}
                taken.append(f"{port}: {', '.join(sorted(holders)) or 'held'}")
    if taken:
        sys.exit("ports in use, stop what holds them first (a `make up` deployment, another "
                 "benchmark):\n  " + "\n  ".join(taken))


def wait_ready(url: str, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def rss_mb(processes: list[psutil.Process]) -> float:
    """Resident memory of ``processes`` together; one that has exited counts nothing."""
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def idle_cpu_and_rss(
    pids: dict[str, int], seconds: float = 10.0
) -> tuple[dict[str, float], dict[str, float]]:
    trees = {name: tree(pid) for name, pid in pids.items()}
    for processes in trees.values():
        for proc in processes:
            proc.cpu_percent(None)
    time.sleep(seconds)
    cpu = {name: sum(p.cpu_percent(None) for p in procs) for name, procs in trees.items()}
    rss = {name: rss_mb(procs) for name, procs in trees.items()}
    return cpu, rss


async def ttft(client: httpx.AsyncClient, url: str, prompt: str) -> float:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 8, "stream": True,
            "temperature": 0}
    started = time.perf_counter()
    elapsed: float | None = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if elapsed is None and line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:]).get("choices"):
                    elapsed = time.perf_counter() - started
    if elapsed is None:
        raise RuntimeError(f"{url}: stream without a token")
    return elapsed * 1000


async def throughput(client: httpx.AsyncClient, url: str, streams: int, tokens: int = 128) -> float:
    async def one(i: int) -> int:
        body = {"model": "smollm2", "prompt": f"Story {i}: once upon a time", "max_tokens": tokens,
                "ignore_eos": True, "temperature": 0}
        response = await client.post(f"{url}/v1/completions", json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
        return response.json()["usage"]["completion_tokens"]

    await one(999)  # warm-up
    started = time.perf_counter()
    produced = await asyncio.gather(*(one(i) for i in range(streams)))
    return sum(produced) / (time.perf_counter() - started)


async def measure(url: str, model: str, result: Result, prompts: list[str], fixed: str) -> None:
    async with httpx.AsyncClient(timeout=300) as client:
        await ttft(client, url, "warm-up " + prompts[0][:200])
        for prompt in prompts:
            result.ttft_ms.append(await ttft(client, url, prompt))
        body = {"model": "smollm2", "prompt": fixed, "max_tokens": 32, "temperature": 0,
                "return_token_ids": True}
        # Twice: the second answer is the prefix-cached one on a single server (see the e2e test).
        await client.post(f"{url}/v1/completions", json=body)
        response = await client.post(f"{url}/v1/completions", json=body)
        result.greedy_ids = response.json()["choices"][0]["token_ids"]
        result.tok_s_1 = await throughput(client, url, 1)
        result.tok_s_16 = await throughput(client, url, 16)


def run_pd(channel: str, args: argparse.Namespace, workdir: Path, prompts: list[str],
           fixed: str) -> Result:
    result = Result(name=f"PD 1P1D, {channel}")
    kv_dir = workdir / "kv"
    shutil.rmtree(kv_dir, ignore_errors=True)
    kv_dir.mkdir(parents=True)
    processes = []
    started = time.monotonic()
    for role, port, core, side in (("prefill", PREFILL_PORT, 0, SIDE_PORTS[0]),
                                   ("decode", DECODE_PORT, 1, SIDE_PORTS[1])):
        argv, env = build_command(WorkerSpec(
            role=role, model_path=args.model, served_model_name="smollm2", port=port,
            max_model_len=2048, kv_channel=channel, kv_storage_path=str(kv_dir),
            side_channel_port=side, cpu_cores=(core,), dtype=args.dtype,
            sampling_defaults={"temperature": 0.0}, cache_dir=str(workdir / "cache"),
        ))
        processes.append(start(argv, env, workdir / f"{channel}-{role}.log"))
    router_argv = [sys.executable, "-m", "inference.router", "--served-model-name", "smollm2",
                   "--tokenizer", args.model, "--max-model-len", "2048", "--kv-channel", channel,
                   "--port", str(ROUTER_PORT), "--prefill", f"http://127.0.0.1:{PREFILL_PORT}",
                   "--decode", f"http://127.0.0.1:{DECODE_PORT}"]
    processes.append(start(router_argv, {}, workdir / f"{channel}-router.log"))
    try:
        wait_ready(f"http://127.0.0.1:{ROUTER_PORT}")
        result.start_s = time.monotonic() - started
        time.sleep(5)
        result.idle_cpu, result.rss_mb = idle_cpu_and_rss(
            {"prefill": processes[0].pid, "decode": processes[1].pid, "router": processes[2].pid})
        asyncio.run(measure(f"http://127.0.0.1:{ROUTER_PORT}", args.model, result, prompts, fixed))
    finally:
        stop(processes)
    return result


def run_single(args: argparse.Namespace, workdir: Path, prompts: list[str], fixed: str) -> Result:
    result = Result(name="one server, cores 0+1")
    argv, env = build_command(WorkerSpec(
        role="colocated", model_path=args.model, served_model_name="smollm2", port=SINGLE_PORT,
        max_model_len=2048, cpu_cores=(0, 1), dtype=args.dtype,
        sampling_defaults={"temperature": 0.0}, cache_dir=str(workdir / "cache"),
    ))
    started = time.monotonic()
    processes = [start(argv, env, workdir / "single.log")]
    try:
        wait_ready(f"http://127.0.0.1:{SINGLE_PORT}")
        result.start_s = time.monotonic() - started
        time.sleep(5)
        result.idle_cpu, result.rss_mb = idle_cpu_and_rss({"server": processes[0].pid})
        asyncio.run(measure(f"http://127.0.0.1:{SINGLE_PORT}", args.model, result, prompts, fixed))
    finally:
        stop(processes)
    return result


def table(results: list[Result], reference: Result | None) -> str:
    lines = [
        "| configuration | ready after | idle CPU % per process | RSS MB per process | "
        "TTFT 1k-token prompt p50 (min-max) ms | greedy output = one server | tok/s 1 stream | "
        "tok/s 16 streams |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in r.idle_cpu.items())
        rss = ", ".join(f"{k} {v:.0f}" for k, v in r.rss_mb.items())
        ttft = (f"{statistics.median(r.ttft_ms):.0f} ({min(r.ttft_ms):.0f}-{max(r.ttft_ms):.0f})"
                if r.ttft_ms else "-")
        same = "-" if reference is None or r is reference else (
            "yes" if r.greedy_ids == reference.greedy_ids else "NO")
        lines.append(f"| {r.name} | {r.start_s:.0f} s | {cpu} | {rss} | {ttft} | {same} | "
                     f"{r.tok_s_1:.1f} | {r.tok_s_16:.1f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--channels", default="shared-storage,nixl",
                        help="PD configurations to measure after the one-server baseline")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    args.model = str(Path(args.model).resolve())
    require_free_ports(PREFILL_PORT, DECODE_PORT, ROUTER_PORT, SINGLE_PORT, *SIDE_PORTS)
    # Distinct prompts so no TTFT is a prefix-cache hit.
    prompts = [long_prompt(args.model, args.prompt_tokens, f"Ledger {n}.") for n in range(args.repeats)]
    fixed = long_prompt(args.model, args.prompt_tokens, "Ledger fixed.")
    with tempfile.TemporaryDirectory(prefix="pdserve-bench-", dir="/dev/shm") as tmp:
        workdir = Path(tmp)
        single = run_single(args, workdir, prompts, fixed)
        print(table([single], None), flush=True)
        results = [single]
        for channel in args.channels.split(","):
            try:
                results.append(run_pd(channel, args, workdir, prompts, fixed))
            finally:
                for log in workdir.glob(f"{channel}-*.log"):
                    shutil.copy(log, Path(tempfile.gettempdir()) / f"pdserve-bench-{log.name}")
            print(table(results, single), flush=True)
        print("\n" + table(results, single))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
