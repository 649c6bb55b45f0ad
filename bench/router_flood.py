"""How the router's /health answers while a flood of 4 MB prompts arrives.

Starts a stub worker (this file, `stub` subcommand) and the real router (`python -m
inference.router`, from `--repo`: this tree by default, or another checkout such as a `git
worktree` of an earlier commit) with one console-style key, then for each scenario probes
/health every `--probe-interval` s for `--seconds` s while `--clients` clients each send one
4 MB completion request after another:

- over_limit: the key allows 1 request a minute and has used it: every flood request is 429.
- under_limit: the key's limits never refuse: every prompt is tokenized (and then refused 400,
  longer than the context).

Prints one table row per scenario: the flood's answers, and /health latency p50/p99/max.

    .venv/bin/python bench/router_flood.py
    .venv/bin/python bench/router_flood.py --repo /tmp/before --label before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from inference.router.keys import key_hash, new_key, public_prefix  # noqa: E402

MODEL = "bench-model"
LIMITS = {"over_limit": {"requests_per_minute": 1},
          "under_limit": {"requests_per_minute": 10**9, "prompt_tokens_per_minute": 10**12,
                          "generated_tokens_per_minute": 10**12, "max_concurrency": 10**6}}


def run_stub(port: int) -> None:
    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def inference(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
                                  "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}]})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", inference)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def long_prompt(chars: int) -> str:
    """English-like words (this repository's README, letters only): a realistic BPE load."""
    words = [w for w in (ROOT / "README.md").read_text().split() if w.isalpha()]
    rng = random.Random(0)
    text = " ".join(rng.choice(words) for _ in range(chars // 4))
    return text[:chars]


async def wait_healthy(session: aiohttp.ClientSession, url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/health") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout_s}s")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def scenario(args: argparse.Namespace, name: str, stub: str, body: bytes,
                   workdir: Path) -> dict[str, Any]:
    key = new_key()
    keys = workdir / f"keys-{name}.json"
    keys.write_text(json.dumps({"version": "bench", "require_key": True, "keys": [
        {"id": 1, "prefix": public_prefix(key), "hash": key_hash(key), "limits": LIMITS[name]}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "inference.router", "--served-model-name", MODEL,
            "--tokenizer", str(args.tokenizer), "--max-model-len", "2048", "--host", "127.0.0.1",
            "--port", str(port), "--colocated", stub, "--keys-file", str(keys)]
    if args.router_cores:
        argv = ["taskset", "-c", args.router_cores, *argv]
    env = {**os.environ, "REDIS_URL": "", "PDSERVE_API_KEY": "", "PYTHONUNBUFFERED": "1"}
    env.pop("PDSERVE_API_KEY")
    log = open(workdir / f"router-{name}.log", "wb")  # noqa: SIM115 - closed below
    router = subprocess.Popen(argv, cwd=args.repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await wait_healthy(session, url)
            if name == "over_limit":  # the key's one request this minute
                small = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4})
                async with session.post(url + "/v1/completions", data=small,
                                        headers=headers) as response:
                    assert response.status == 200, await response.text()
            statuses: Counter[str] = Counter()
            durations: list[float] = []
            stop = time.monotonic() + args.seconds

            async def flood() -> None:
                async with aiohttp.ClientSession(timeout=timeout) as own:
                    while time.monotonic() < stop:
                        started = time.perf_counter()
                        try:
                            async with own.post(url + "/v1/completions", data=body,
                                                headers=headers) as response:
                                await response.read()
                                statuses[str(response.status)] += 1
                        except (TimeoutError, aiohttp.ClientError) as exc:
                            statuses[type(exc).__name__] += 1
                        durations.append(time.perf_counter() - started)

            async def probe() -> list[float]:
                latencies = []
                async with aiohttp.ClientSession(timeout=timeout) as own:
                    await asyncio.sleep(0.5)  # the flood under way
                    while time.monotonic() < stop:
                        started = time.perf_counter()
                        async with own.get(url + "/health") as response:
                            await response.read()
                        latencies.append(time.perf_counter() - started)
                        await asyncio.sleep(args.probe_interval)
                return latencies

            *_, latencies = await asyncio.gather(*(flood() for _ in range(args.clients)), probe())
    finally:
        router.terminate()
        try:
            router.wait(timeout=10)
        except subprocess.TimeoutExpired:
            router.kill()
        log.close()
    return {"scenario": name, "statuses": dict(sorted(statuses.items())), "flood": len(durations),
            "flood_p50_s": pct(durations, 0.5), "health": latencies}


async def run(args: argparse.Namespace) -> int:
    body = json.dumps({"model": MODEL, "prompt": long_prompt(args.prompt_chars),
                       "max_tokens": 16}).encode()
    port = free_port()
    stub = subprocess.Popen([sys.executable, __file__, "stub", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="router-flood-") as tmp:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{port}")
            for name in args.scenarios:
                results.append(await scenario(args, name, f"http://127.0.0.1:{port}", body, Path(tmp)))
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    print(f"\nrouter from {args.repo} ({args.label}); {args.clients} clients sending "
          f"{len(body) / 1e6:.1f} MB bodies for {args.seconds:g} s; /health every "
          f"{args.probe_interval * 1000:g} ms")
    print("| router | scenario | flood answers | flood p50 s | /health n | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ms = [v * 1000 for v in r["health"]]
        answers = ", ".join(f"{n} x {s}" for s, n in r["statuses"].items())
        print(f"| {args.label} | {r['scenario']} | {answers} | {r['flood_p50_s']:.2f} | {len(ms)} | "
              f"{pct(ms, 0.5):.1f} | {pct(ms, 0.99):.1f} | {max(ms, default=float('nan')):.1f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    stub = sub.add_parser("stub")
    stub.add_argument("--port", type=int, required=True)
    parser.add_argument("--repo", type=Path, default=ROOT, help="source tree whose router runs")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--tokenizer", type=Path,
                        default=ROOT / "data" / "models" / "smollm2-135m-instruct")
    parser.add_argument("--scenarios", nargs="+", default=["over_limit", "under_limit"],
                        choices=sorted(LIMITS))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--prompt-chars", type=int, default=4_000_000)
    parser.add_argument("--probe-interval", type=float, default=0.05)
    parser.add_argument("--request-timeout", type=float, default=300)
    parser.add_argument("--router-cores", default="", help="taskset core list for the router")
    args = parser.parse_args()
    if args.command == "stub":
        run_stub(args.port)
        return 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
