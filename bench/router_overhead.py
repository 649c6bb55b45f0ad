"""What the router adds: TTFT, time per streamed chunk, CPU, and the most non-streamed
requests per second it serves on one core.

It starts stub OpenAI-compatible backends (this file, `stub` subcommand: aiohttp, a fixed time
to the first token and between tokens, one SSE chunk per token) and the real router
(`python -m inference.router`, with an admin token set, metrics on, logging its timeline line
per request to a file as under the supervisor). Clients send a console-style API key
(`--keys-file`) that has all four limits set, high enough never to refuse, so every request pays
for the whole check: key lookup, prompt tokenization for the prompt-token limit, the
generated-token reservation and its reconciliation, the concurrency lease. `--limits` picks where
the counters live: `memory` (the router's own) and `redis` (REDIS_URL, default the local Redis,
which runs unpinned); `off` is the legacy single PDSERVE_API_KEY without limits. The router runs on one core
(taskset), stubs and this load generator on the others. Then, per mode and concurrency, it
alternates rounds sent straight to the stubs ("direct") with rounds sent through the router:

- colocated: one stub; direct = one streamed request to it.
- pd: a prefill stub and a decode stub; direct = the same two calls made by the client itself
  (a one-token non-streamed prefill with return_token_ids and NIXL kv_transfer_params, then the
  streamed decode with prefill's token ids and params), so "added" is the router's own cost.

Metrics follow vLLM's bench client (../shared/notes/metrics.md): TTFT = first SSE message with
non-empty choices; ITL = gaps between such messages. Added TTFT pXX = router pXX - direct pXX.
A concurrency of C keeps C requests open in a closed loop, their starts spread over one request
time so that the C clients do not move in lock step.

    .venv/bin/python bench/router_overhead.py                  # full run, ~14 minutes
    .venv/bin/python bench/router_overhead.py --round-seconds 1 --rounds 2 --concurrency 1 16

Peers (`--peers`, default all three; colocated mode only, and not with `--hop gateway`): the same
colocated measurements are made, in the same run and on the same router core, for

- pdserve: the router as above, once per `--limits` value;
- sglang: sglang-router (`python -m sglang_router.launch_router --policy round_robin`, a Rust
  router behind a Python launcher; its CPU is the launcher's process and any children), run by
  `--sglang-python` (default .venv-bench/bin/python, made by `bash scripts/install-bench.sh`);
- naive: the simplest honest proxy, as vLLM's disaggregation proxy examples are (in
  bench/router_peers.py: aiohttp, one shared client session, the body forwarded and the
  answer's bytes streamed back unchanged, no keys).

The peers have no limits and run once. A third table, "Peers side by side", gives per peer the
non-streamed req/s at `--throughput-concurrency` (32), the CPU per streamed request at the
highest `--concurrency`, the added TTFT p50 at the lowest, and pdserve against sglang-router with
issue 26's targets (req/s >= 0.9x, CPU <= 1.5x, TTFT p50 at most 2 ms more). To reproduce it
(colocated mode only, pdserve with both kinds of counters):

    bash scripts/install-bench.sh
    .venv/bin/python bench/router_overhead.py --modes colocated --limits memory redis

`--endpoint chat` sends the same prompt as one user message to /v1/chat/completions instead: the
router renders it with the model's chat template for its length check and the PD hand-off. The
stubs answer prefill with the token ids of that rendering (computed here with the tokenizer's
own template, as the router computes them), so the hand-off goes through as with vLLM; the
router's `pdserve_router_pd_fallback_total` is printed at the end to show it did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy
import psutil
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.router_peers import check_sglang, print_peers, sglang_argv  # noqa: E402
from inference.router.keys import key_hash, new_key, public_prefix  # noqa: E402

MODEL = "bench-model"
LEGACY_KEY = "bench-inference-key"
# One key for the whole run: fresh counters in Redis, never a secret worth keeping.
API_KEY = new_key()
ADMIN_TOKEN = "bench-admin-token"
# High enough never to refuse: the point is what checking them costs.
NEVER_REFUSING = {"requests_per_minute": 10**9, "prompt_tokens_per_minute": 10**12,
                  "generated_tokens_per_minute": 10**12, "max_concurrency": 10**6}
# What the stub returns as prefill's prompt token ids: the router passes them to decode.
STUB_PROMPT_IDS = list(range(1, 151))
KV_PARAMS = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
             "remote_engine_id": "stub", "remote_host": "127.0.0.1", "remote_port": 1, "tp_size": 1}
NIXL_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}
TOKEN_CHUNK = b'"choices":[{'


# ---- the stub backend (a separate process) ------------------------------------------------------

def run_stub(port: int, ttft_ms: float, itl_ms: float, tokens: int, prefill_ms: float,
             chat_ids_file: Path | None) -> None:
    ttft, itl, prefill = ttft_ms / 1000, itl_ms / 1000, prefill_ms / 1000
    chat_ids = json.loads(chat_ids_file.read_text()) if chat_ids_file else STUB_PROMPT_IDS

    def chunk(i: int) -> bytes:
        event = {"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
                 "choices": [{"index": 0, "text": f" tok{i}", "finish_reason": None}]}
        return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

    chunks = [chunk(i) for i in range(tokens)]
    usage = {"prompt_tokens": len(STUB_PROMPT_IDS), "completion_tokens": tokens,
             "total_tokens": len(STUB_PROMPT_IDS) + tokens}
    tail = (b"data: " + json.dumps({"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
                                    "choices": [], "usage": usage}, separators=(",", ":")).encode()
            + b"\n\ndata: [DONE]\n\n")
    answer = json.dumps({"id": "cmpl-stub", "object": "text_completion", "model": MODEL,
                         "choices": [{"index": 0, "text": "".join(f" tok{i}" for i in range(tokens)),
                                      "finish_reason": "length"}],
                         "usage": usage}).encode()

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def inference(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("return_token_ids") and body.get("max_tokens") == 1:
            if prefill:
                await asyncio.sleep(prefill)
            reply: dict[str, Any] = {"id": "cmpl-prefill", "object": "text_completion", "model": MODEL,
                                     "choices": [{"index": 0, "text": " tok0", "finish_reason": "length",
                                                  "prompt_token_ids": STUB_PROMPT_IDS}]}
            if "messages" in body:
                # vLLM's chat answer carries the rendered prompt's ids at the top level.
                reply["prompt_token_ids"] = chat_ids
            if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
                reply["kv_transfer_params"] = KV_PARAMS
            return web.json_response(reply)
        if ttft:
            await asyncio.sleep(ttft)
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, data in enumerate(chunks):
            if i and itl:
                await asyncio.sleep(itl)
            await response.write(data)
        await response.write(tail)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", inference)
    app.router.add_post("/v1/chat/completions", inference)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# ---- processes ---------------------------------------------------------------------------------

def free_port() -> int:
    # Ephemeral range (well clear of the deployment ports 8000-8400 and 5600-5700).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Procs:
    cores_router: str
    cores_harness: str
    logdir: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], cores: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(["taskset", "-c", cores, *argv], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, cwd=ROOT)
        self.started.append(proc)
        return proc

    def stub(self, args: argparse.Namespace, *, ttft_ms: float, itl_ms: float) -> str:
        port = free_port()
        argv = [sys.executable, __file__, "stub", "--port", str(port), "--ttft-ms", str(ttft_ms),
                "--itl-ms", str(itl_ms), "--tokens", str(args.tokens),
                "--prefill-ms", str(args.prefill_ms)]
        if args.endpoint == "chat":
            ids = self.logdir / "chat-prompt-ids.json"
            if not ids.exists():
                ids.write_text(json.dumps(chat_prompt_ids(args)))
            argv += ["--chat-ids-file", str(ids)]
        self.spawn(f"stub-{port}", argv, self.cores_harness)
        return f"http://127.0.0.1:{port}"

    def router(self, args: argparse.Namespace, name: str, roles: list[tuple[str, str]],
               limits: str) -> tuple[str, psutil.Process]:
        port = free_port()
        argv = [sys.executable, "-m", "inference.router", "--served-model-name", MODEL,
                "--tokenizer", str(args.tokenizer), "--max-model-len", "4096", "--kv-channel", "nixl",
                "--host", "127.0.0.1", "--port", str(port)]
        for flag, url in roles:
            argv += [flag, url]
        env = {"PDSERVE_ROUTER_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1"}
        if limits == "off":
            env["PDSERVE_API_KEY"] = LEGACY_KEY
        else:
            keys = self.logdir / "keys.json"
            limits = dict(NEVER_REFUSING)
            if args.without_prompt_limit:
                # The one limit that makes the router tokenize every prompt.
                del limits["prompt_tokens_per_minute"]
            keys.write_text(json.dumps({"version": "bench", "require_key": True, "keys": [
                {"id": 1, "prefix": public_prefix(API_KEY), "hash": key_hash(API_KEY),
                 "limits": limits}]}))
            argv += ["--keys-file", str(keys)]
        # The router must not inherit a REDIS_URL meant for something else.
        env["REDIS_URL"] = args.redis_url if limits == "redis" else ""
        proc = self.spawn(name, argv, self.cores_router, env=env)
        return f"http://127.0.0.1:{port}", psutil.Process(proc.pid)

    def gateway(self, name: str, router: str, key: str) -> tuple[str, psutil.Process]:
        """The gateway (python -m inference.gateway) in front of ``router``, on the router's
        core: what one more hop costs against serving every deployment from one process."""
        port = free_port()
        config = self.logdir / f"{name}.json"
        keys = [] if key == LEGACY_KEY else [{
            "id": 1, "prefix": public_prefix(key), "hash": key_hash(key), "state": "active",
            "deployments": ["bench"]}]
        config.write_text(json.dumps({"version": "bench", "deployments": [{
            "name": "bench", "served_model_name": MODEL, "router": router, "state": "running",
            "team": "bench", "require_key": bool(keys)}], "aliases": [], "keys": keys}))
        argv = [sys.executable, "-m", "inference.gateway", "--host", "127.0.0.1", "--port",
                str(port), "--config-file", str(config)]
        proc = self.spawn(name, argv, self.cores_router, env={"PYTHONUNBUFFERED": "1"})
        return f"http://127.0.0.1:{port}", psutil.Process(proc.pid)

    def sglang_router(self, args: argparse.Namespace, name: str, backend: str
                      ) -> tuple[str, psutil.Process]:
        port = free_port()
        proc = self.spawn(name, sglang_argv(args.sglang_python, port, backend, free_port()),
                          self.cores_router)
        return f"http://127.0.0.1:{port}", psutil.Process(proc.pid)

    def naive_proxy(self, name: str, backend: str) -> tuple[str, psutil.Process]:
        port = free_port()
        argv = [sys.executable, str(Path(__file__).with_name("router_peers.py")), "--port",
                str(port), "--backend", backend]
        proc = self.spawn(name, argv, self.cores_router, env={"PYTHONUNBUFFERED": "1"})
        return f"http://127.0.0.1:{port}", psutil.Process(proc.pid)

    def stop(self) -> None:
        for proc in self.started:
            proc.terminate()
        for proc in self.started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.started.clear()


async def wait_healthy(session: aiohttp.ClientSession, url: str, timeout_s: float = 120,
                       proc: psutil.Process | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.status() == psutil.STATUS_ZOMBIE:
            raise RuntimeError(f"{url}: process {proc.pid} exited before answering; its log is"
                               f" in the logs directory")
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(url + "/health") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout_s}s")


# ---- clients -----------------------------------------------------------------------------------

@dataclass
class Sample:
    ttft: float
    gaps: list[float]


@dataclass
class Target:
    """Where a request goes: through the router, or straight to the stubs."""

    session: aiohttp.ClientSession
    router: str | None = None
    full: str | None = None
    prefill: str | None = None
    decode: str | None = None
    key: str = API_KEY

    async def call(self, body: dict[str, Any], stream: bool) -> Sample | None:
        st = time.perf_counter()
        headers: dict[str, str] = {}
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        if self.router is not None:
            base, headers = self.router, {"Authorization": f"Bearer {self.key}"}
        elif self.full is not None:
            base = self.full
        else:
            assert self.prefill is not None and self.decode is not None
            first = {**body, "stream": False, "max_tokens": 1, "return_token_ids": True,
                     "kv_transfer_params": NIXL_PREFILL}
            first.pop("stream_options", None)
            async with self.session.post(self.prefill + path, json=first) as response:
                response.raise_for_status()
                data = await response.json()
            base = self.decode
            body = {**body, "kv_transfer_params": data["kv_transfer_params"]}
            if "prompt" in body:
                body["prompt"] = data["choices"][0]["prompt_token_ids"]
        async with self.session.post(base + path, json=body, headers=headers) as response:
            response.raise_for_status()
            if not stream:
                await response.read()
                return None
            stamps = []
            async for line in response.content:
                # A token-bearing message (non-empty choices); cheaper than parsing JSON, and
                # the load generator shares its core with the stubs.
                if line.startswith(b"data: ") and TOKEN_CHUNK in line:
                    stamps.append(time.perf_counter())
        if not stamps:
            raise RuntimeError("stream without a token")
        return Sample(ttft=stamps[0] - st, gaps=[b - a for a, b in zip(stamps, stamps[1:], strict=False)])


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of ``proc`` and its live children: a launcher may hand the serving to
    a child process (sglang-router's may run its Rust server either way)."""
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


@dataclass
class Round:
    samples: list[Sample] = field(default_factory=list)
    failed: int = 0
    router_cpu_s: float = 0.0
    completed: int = 0
    seconds: float = 0.0


async def closed_loop(target: Target, body: dict[str, Any], concurrency: int, seconds: float,
                      spread_s: float, stream: bool, router: psutil.Process) -> Round:
    result = Round()
    cpu_before = cpu_seconds(router)
    started = time.perf_counter()
    deadline = started + seconds

    async def client(index: int) -> None:
        await asyncio.sleep(spread_s * index / concurrency)
        while time.perf_counter() < deadline:
            try:
                sample = await target.call(body, stream)
                if sample is not None:
                    result.samples.append(sample)
                result.completed += 1
            except (aiohttp.ClientError, TimeoutError, RuntimeError, KeyError):
                result.failed += 1

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    result.seconds = time.perf_counter() - started
    result.router_cpu_s = cpu_seconds(router) - cpu_before
    return result


# ---- the runs ----------------------------------------------------------------------------------

def prompt_text(words: int) -> str:
    vocabulary = "the quick brown fox jumps over a lazy dog while prefill and decode workers share".split()
    return " ".join(vocabulary[i % len(vocabulary)] for i in range(words))


def request_body(args: argparse.Namespace, **fields: Any) -> dict[str, Any]:
    text = prompt_text(args.prompt_words)
    prompt = {"messages": [{"role": "user", "content": text}]} if args.endpoint == "chat" \
        else {"prompt": text}
    return {"model": MODEL, **prompt, "max_tokens": args.tokens, **fields}


def chat_prompt_ids(args: argparse.Namespace) -> list[int]:
    """The chat request's prompt as the model's template renders it (what vLLM's prefill
    reports)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    messages = request_body(args)["messages"]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def pct(values: list[float], q: float) -> float:
    return float(numpy.percentile(values, q)) * 1000 if values else float("nan")


async def pd_fallbacks(session: aiohttp.ClientSession, router: str) -> float:
    """The router's pdserve_router_pd_fallback_total, all reasons: requests whose prompt decode
    computed itself instead of taking prefill's KV."""
    async with session.get(router + "/metrics",
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("pdserve_router_pd_fallback_total{"))


@dataclass
class Setup:
    mode: str
    limits: str
    direct: Target
    routed: Target
    router: psutil.Process
    peer: str = "pdserve"

    @property
    def pd_router(self) -> str:
        """The router's address: behind the gateway (--hop gateway) it is the direct target."""
        return self.direct.router or self.routed.router or ""


async def fallbacks(setup: Setup) -> float:
    # Only pdserve's router has the counter; the peers do no PD hand-off here.
    if setup.peer != "pdserve":
        return 0.0
    return await pd_fallbacks(setup.routed.session, setup.pd_router)


async def latency(setup: Setup, args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    body = request_body(args, stream=True, stream_options={"include_usage": True})
    spread = (args.prefill_ms if setup.mode == "pd" else 0) / 1000 + (
        args.ttft_ms + args.itl_ms * (args.tokens - 1)) / 1000
    rounds: dict[str, list[Round]] = {"direct": [], "router": []}
    # Warm-up: connections opened, caches filled, on both paths.
    for target in (setup.direct, setup.routed):
        await closed_loop(target, body, concurrency, 0.5, spread, True, setup.router)
    for _ in range(args.rounds):
        for name, target in (("direct", setup.direct), ("router", setup.routed)):
            rounds[name].append(await closed_loop(target, body, concurrency, args.round_seconds,
                                                  spread, True, setup.router))
    samples = {name: [s for r in rs for s in r.samples] for name, rs in rounds.items()}
    ttft = {name: [s.ttft for s in ss] for name, ss in samples.items()}
    gaps = {name: [g for s in ss for g in s.gaps] for name, ss in samples.items()}
    routed_requests = sum(r.completed for r in rounds["router"])
    return {
        "peer": setup.peer, "mode": setup.mode, "limits": setup.limits, "concurrency": concurrency,
        "requests": {name: len(ss) for name, ss in samples.items()},
        "failed": {name: sum(r.failed for r in rs) for name, rs in rounds.items()},
        "ttft_p50": {name: pct(v, 50) for name, v in ttft.items()},
        "ttft_p99": {name: pct(v, 99) for name, v in ttft.items()},
        "itl_mean": {name: float(numpy.mean(v)) * 1000 for name, v in gaps.items()},
        "itl_p99": {name: pct(v, 99) for name, v in gaps.items()},
        "router_cpu_s_per_1k": 1000 * sum(r.router_cpu_s for r in rounds["router"]) / max(routed_requests, 1),
        "pd_fallbacks": await fallbacks(setup),
    }


async def throughput(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    body = request_body(args)
    rounds: dict[str, list[Round]] = {"direct": [], "router": []}
    for target in (setup.direct, setup.routed):
        await closed_loop(target, body, args.throughput_concurrency, 1.0, 0, False, setup.router)
    for _ in range(args.rounds):
        for name, target in (("direct", setup.direct), ("router", setup.routed)):
            rounds[name].append(await closed_loop(target, body, args.throughput_concurrency,
                                                  args.round_seconds, 0, False, setup.router))
    routed = rounds["router"]
    completed = sum(r.completed for r in routed)
    cpu = sum(r.router_cpu_s for r in routed)
    return {
        "peer": setup.peer, "mode": setup.mode, "limits": setup.limits,
        "direct_rps": max(r.completed / r.seconds for r in rounds["direct"]),
        "router_rps": max(r.completed / r.seconds for r in routed),
        "router_cpu_pct": 100 * cpu / sum(r.seconds for r in routed),
        "router_cpu_s_per_1k": 1000 * cpu / max(completed, 1),
        "failed": {name: sum(r.failed for r in rs) for name, rs in rounds.items()},
        "pd_fallbacks": await fallbacks(setup),
    }


@contextlib.contextmanager
def processes(args: argparse.Namespace) -> Iterator[Procs]:
    logdir = Path(tempfile.mkdtemp(prefix="router-overhead-"))
    procs = Procs(args.router_core, args.harness_cores, logdir)
    try:
        yield procs
    finally:
        procs.stop()
        print(f"\nlogs: {logdir}", file=sys.stderr)


async def setups(procs: Procs, args: argparse.Namespace, session: aiohttp.ClientSession,
                 streaming: bool, limits: str) -> list[Setup]:
    delays = ({"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms} if streaming
              else {"ttft_ms": 0, "itl_ms": 0})
    kind = "stream" if streaming else "rps"
    key = LEGACY_KEY if limits == "off" else API_KEY
    result = []
    if "colocated" in args.modes:
        full = procs.stub(args, **delays)
        router, proc = procs.router(args, f"router-colocated-{kind}-{limits}",
                                    [("--colocated", full)], limits)
        result.append(Setup("colocated", limits, Target(session, full=full),
                            Target(session, router=router, key=key), proc))
    if "pd" in args.modes:
        prefill = procs.stub(args, **delays)
        decode = procs.stub(args, **delays)
        router, proc = procs.router(args, f"router-pd-{kind}-{limits}",
                                    [("--prefill", prefill), ("--decode", decode)], limits)
        result.append(Setup("pd", limits, Target(session, prefill=prefill, decode=decode),
                            Target(session, router=router, key=key), proc))
    if args.hop == "gateway":
        # "direct" is now the router, "router" the gateway in front of it: the figures are
        # the gateway's own cost.
        result = [replace(setup, direct=setup.routed,
                          routed=Target(session, router=gateway, key=key), router=proc)
                  for setup in result
                  for gateway, proc in [procs.gateway(f"gateway-{setup.mode}-{kind}-{limits}",
                                                      setup.routed.router or "", key)]]
    for setup in result:
        for target in (setup.direct, setup.routed):
            for url in (target.router, target.full, target.prefill, target.decode):
                if url:
                    await wait_healthy(session, url)
    return result


async def peer_setups(procs: Procs, args: argparse.Namespace, session: aiohttp.ClientSession,
                      streaming: bool) -> list[Setup]:
    """The peers pdserve's colocated router is compared with, each in front of its own stub of
    the same kind and on the router's core."""
    delays = ({"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms} if streaming
              else {"ttft_ms": 0, "itl_ms": 0})
    kind = "stream" if streaming else "rps"
    result = []
    for peer in args.peers:
        if peer == "pdserve":
            continue
        full = procs.stub(args, **delays)
        # sglang-router checks its workers once at start, then only every 30 s: the stub must
        # already answer.
        await wait_healthy(session, full)
        if peer == "sglang":
            proxy, proc = procs.sglang_router(args, f"sglang-{kind}", full)
        else:
            proxy, proc = procs.naive_proxy(f"naive-{kind}", full)
        await wait_healthy(session, proxy, proc=proc)
        result.append(Setup("colocated", "-", Target(session, full=full),
                            Target(session, router=proxy), proc, peer=peer))
    return result


async def group_setups(procs: Procs, args: argparse.Namespace, session: aiohttp.ClientSession,
                       streaming: bool, limits: str | None) -> list[Setup]:
    """pdserve's setups with its counters in ``limits``, or (None) the peers'."""
    if limits is None:
        return await peer_setups(procs, args, session, streaming)
    return await setups(procs, args, session, streaming, limits)


def other_load() -> str:
    """CPU already busy before the run: other work on the box skews every figure."""
    busy = psutil.cpu_percent(interval=2, percpu=True)
    note = ", ".join(f"core {i} {pct:.0f} %" for i, pct in enumerate(busy))
    return note + (" -- NOT QUIET, figures are skewed" if max(busy) > 15 else " (quiet)")


def peers_run(args: argparse.Namespace) -> bool:
    """Whether sglang-router or the naive proxy are measured: they stand in for the colocated
    router only, and --hop gateway measures a different thing (the gateway's hop)."""
    return ("colocated" in args.modes and args.hop == "router"
            and any(peer != "pdserve" for peer in args.peers))


async def run(args: argparse.Namespace) -> int:
    if peers_run(args) and "sglang" in args.peers:
        check_sglang(args.sglang_python)
    if args.hop == "gateway" and any(peer != "pdserve" for peer in args.peers):
        print("--hop gateway: measuring pdserve only, the peers have no gateway in front",
              file=sys.stderr)
    os.sched_setaffinity(0, {int(c) for c in args.harness_cores.split(",")})
    load_before = other_load()
    latencies, rates = [], []
    with processes(args) as procs:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=60)) as session:
            # pdserve once per place its counters live, the peers (which have no limits) once.
            groups: list[str | None] = list(args.limits) if "pdserve" in args.peers else []
            if peers_run(args):
                groups.append(None)
            for limits in groups:
                for setup in [] if args.throughput_only else await group_setups(
                        procs, args, session, True, limits):
                    for concurrency in args.concurrency:
                        latencies.append(await latency(setup, args, concurrency))
                        print(json.dumps(latencies[-1]), file=sys.stderr)
                procs.stop()
                for setup in await group_setups(procs, args, session, False, limits):
                    rates.append(await throughput(setup, args))
                    print(json.dumps(rates[-1]), file=sys.stderr)
                procs.stop()
    print(f"\nCPU busy before the run: {load_before}")
    print(f"Endpoint: /v1/{'chat/completions' if args.endpoint == 'chat' else 'completions'}; "
          f"PD fallbacks counted by the routers: "
          f"{sum(r['pd_fallbacks'] for r in latencies + rates):g}")
    print_tables(args, latencies, rates)
    return 0


def pair(result: dict[str, Any], key: str, digits: int) -> str:
    """"direct / router | router - direct" cells."""
    direct, router = result[key]["direct"], result[key]["router"]
    return f"{direct:.{digits}f} / {router:.{digits}f} | {router - direct:.{digits}f}"


def print_tables(args: argparse.Namespace, latencies: list[dict[str, Any]],
                 rates: list[dict[str, Any]]) -> None:
    prompt_limit = "without" if args.without_prompt_limit else "with"
    print(f"\nKey: {prompt_limit} a prompt-token limit (limits other than off).")
    print(f"\nStub: TTFT {args.ttft_ms:g} ms, {args.tokens} chunks {args.itl_ms:g} ms apart"
          f" (PD: prefill {args.prefill_ms:g} ms); prompt {args.prompt_words} words; router on core"
          f" {args.router_core}, stubs and client on {args.harness_cores}; {args.rounds} rounds of"
          f" {args.round_seconds:g} s per side, interleaved.\n")
    print("| peer | mode | limits | conc. | requests direct / router | failed"
          " | TTFT p50 direct / router ms | added TTFT p50 ms | TTFT p99 direct / router ms"
          " | added TTFT p99 ms | ITL mean direct / router ms | added per chunk ms"
          " | router CPU s / 1k req |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in latencies:
        print(f"| {r['peer']} | {r['mode']} | {r['limits']} | {r['concurrency']}"
              f" | {r['requests']['direct']} / {r['requests']['router']}"
              f" | {r['failed']['direct']} / {r['failed']['router']} | {pair(r, 'ttft_p50', 2)}"
              f" | {pair(r, 'ttft_p99', 2)} | {pair(r, 'itl_mean', 3)} | {r['router_cpu_s_per_1k']:.2f} |")
    print(f"\nNon-streamed, stubs answering at once, {args.throughput_concurrency} connections:\n")
    print("| peer | mode | limits | direct req/s (harness ceiling) | router req/s"
          " | router CPU % of its core | router CPU s / 1k req | router req/s per core implied by CPU"
          " | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rates:
        print(f"| {r['peer']} | {r['mode']} | {r['limits']} | {r['direct_rps']:,.0f}"
              f" | {r['router_rps']:,.0f}"
              f" | {r['router_cpu_pct']:.0f}"
              f" | {r['router_cpu_s_per_1k']:.3f} | {1000 / r['router_cpu_s_per_1k']:,.0f}"
              f" | {r['failed']['direct']} / {r['failed']['router']} |")
    if any(r["peer"] != "pdserve" for r in rates):
        print_peers(args, latencies, rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    stub = sub.add_parser("stub", help="run one stub backend (used by the benchmark itself)")
    stub.add_argument("--port", type=int, required=True)
    stub.add_argument("--chat-ids-file", type=Path,
                      help="the prompt token ids a chat prefill answers with")
    for p in (parser, stub):
        p.add_argument("--ttft-ms", type=float, default=20.0, help="stub: time to the first token")
        p.add_argument("--itl-ms", type=float, default=5.0, help="stub: time between tokens")
        p.add_argument("--tokens", type=int, default=16, help="stub: chunks per streamed answer")
        p.add_argument("--prefill-ms", type=float, default=20.0, help="stub: time of a prefill (PD)")
    parser.add_argument("--modes", nargs="+", default=["colocated", "pd"], choices=["colocated", "pd"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per side, interleaved")
    parser.add_argument("--round-seconds", type=float, default=4.0)
    parser.add_argument("--throughput-concurrency", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=100)
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                        help="chat: the prompt as one user message, rendered by the router")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "data/models/smollm2-135m-instruct")
    parser.add_argument("--limits", nargs="+", default=["memory", "redis"],
                        choices=["off", "memory", "redis"],
                        help="where the key's rate-limit counters live (off: legacy key, no limits)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--without-prompt-limit", action="store_true",
                        help="the key has no prompt-token limit, so prompts are not tokenized for it")
    parser.add_argument("--throughput-only", action="store_true",
                        help="only the non-streamed requests/s, not the streamed latencies")
    parser.add_argument("--hop", choices=["router", "gateway"], default="router",
                        help="gateway: measure the gateway in front of the router against the "
                             "router alone (both on the router's core)")
    parser.add_argument("--peers", nargs="+", default=["pdserve", "sglang", "naive"],
                        choices=["pdserve", "sglang", "naive"],
                        help="what serves the colocated mode: pdserve's router (per --limits), "
                             "sglang-router, the naive aiohttp proxy")
    parser.add_argument("--sglang-python", type=Path, default=ROOT / ".venv-bench/bin/python",
                        help="an interpreter with sglang-router (scripts/install-bench.sh)")
    parser.add_argument("--router-core", default="0")
    parser.add_argument("--harness-cores", default="1")
    args = parser.parse_args()
    if args.command is None and "pdserve" not in args.peers and not peers_run(args):
        parser.error("nothing to measure: the peers other than pdserve run in colocated mode with"
                     " --hop router only")
    if args.command == "stub":
        run_stub(args.port, args.ttft_ms, args.itl_ms, args.tokens, args.prefill_ms,
                 args.chat_ids_file)
        return 0
    # Absolute, not resolved: the processes start in the repository root, and resolving would
    # follow a venv's python symlink out of the venv.
    args.sglang_python = args.sglang_python.absolute()
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
