"""``python -m inference.advisor measure``: a running vLLM server's speeds, as speeds.py reads them.

Everything goes through the server's HTTP API (``/v1/models``, ``/tokenize``,
``/v1/completions``), so it measures any worker the supervisor started, and a stub in tests:

- prefill: ``batch`` concurrent prompts of ``tokens / batch`` token ids each, one output token;
  the wall time until all have answered is one prefill step (vLLM batches concurrent prompts
  into a step while they fit in ``max_num_batched_tokens``). Each prompt starts with a token of
  its own, so the prefix cache never serves it;
- decode step: ``batch`` concurrent requests with a ``context``-token prompt, of ``tokens`` and
  of one output token; the extra time over the extra tokens is one step at that batch;
- interference: a decode stream's longest token gap while a ``tokens`` prompt is prefilled on
  the same server, over that prompt's prefill plus one decode step measured alone;
- neighbour (only with ``--neighbour-url``, a second server of the same model on another core
  of the node): the decode step at the largest batch and shortest context again, while the
  second server decodes a batch as large without pause, over the step alone;
- KV hand-off (only with ``--kv-dir`` and ``--kv-bytes-per-token``): writing, syncing and reading
  back a prompt's KV bytes in the shared-storage channel's directory, which is what that
  channel does per prompt. Without them no hand-off is reported; the caller supplies one.

Progress lines go to stdout as JSON (``{"event": "progress", ...}``), then one
``{"event": "result", "speeds": {...}}`` line; a failure is one ``{"event": "error", ...}`` line
and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from inference.output_gate import GateError, served_model
from inference.variant_speed import prompt_ids
from inference.worker_auth import bearer

TIMEOUT_S = 600.0
# The server's key comes through the environment or a file: a command line is visible to every
# user.
KEY_ENV = "PDSERVE_MEASURE_KEY"
DECODE_TOKENS = 32
DECODE_ATTEMPTS = 3
STREAM_TOKENS = 64
# Each of the neighbour's requests: short, so that it stops soon after the measurement.
NEIGHBOUR_TOKENS = 64
NEIGHBOUR_STEP_TOKENS = 4 * DECODE_TOKENS


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def sizes(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers above 0, got {text!r}")
    return values


class Server:
    """One server's completions, with prompts cut from its own tokenizer's ids."""

    def __init__(self, client: httpx.Client, url: str) -> None:
        self.client, self.url = client, url
        self.model = served_model(client, url)
        self._ids: list[int] = []
        self._salt = 0
        self._lock = threading.Lock()

    def prompt(self, tokens: int) -> list[int]:
        if len(self._ids) < tokens:
            self._ids = prompt_ids(self.client, self.url, self.model, max(tokens, 2048))
        with self._lock:
            self._salt += 1
            salt = self._salt
        # A first token of its own: no prefix-cache hit, the whole prompt is computed.
        return [self._ids[(salt * 7919) % len(self._ids)], *self._ids[1:tokens]]

    def complete(self, prompt: list[int], max_tokens: int) -> int:
        response = self.client.post(f"{self.url}/v1/completions", json={
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True})
        if response.status_code != 200:
            raise GateError(f"{self.url}: HTTP {response.status_code}: {response.text[:200]}")
        return int(response.json()["usage"]["completion_tokens"])

    def token_times(self, prompt: list[int], max_tokens: int, started: threading.Event) -> list[float]:
        """When each streamed chunk arrived (perf_counter seconds)."""
        times: list[float] = []
        with self.client.stream("POST", f"{self.url}/v1/completions", json={
                "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}) as response:
            if response.status_code != 200:
                raise GateError(f"{self.url}: HTTP {response.status_code} on a stream")
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    times.append(time.perf_counter())
                    started.set()
        started.set()
        return times


def concurrently(server: Server, count: int, prompt_tokens: int, max_tokens: int) -> float:
    """Wall time of ``count`` requests at once, in milliseconds."""
    prompts = [server.prompt(prompt_tokens) for _ in range(count)]
    with ThreadPoolExecutor(max_workers=count) as pool:
        begun = time.perf_counter()
        list(pool.map(lambda prompt: server.complete(prompt, max_tokens), prompts))
        return (time.perf_counter() - begun) * 1000


def prefill_grid(server: Server, batches: list[int], tokens: list[int], repeats: int) -> dict[str, Any]:
    rows = []
    for batch in batches:
        row = []
        for total in tokens:
            each = max(total // batch, 1)
            times = [concurrently(server, batch, each, 1) for _ in range(repeats)]
            row.append(round(statistics.median(times), 3))
            emit("progress", stage="prefill", batch=batch, tokens=total, ms=row[-1])
        rows.append(row)
    return {"batch": batches, "tokens": tokens, "ms": rows}


def decode_grid(server: Server, batches: list[int], contexts: list[int]) -> dict[str, Any]:
    rows = []
    for batch in batches:
        row = []
        for context in contexts:
            row.append(round(decode_step(server, batch, context), 3))
            emit("progress", stage="decode", batch=batch, context=context, ms=row[-1])
        rows.append(row)
    return {"batch": batches, "context": contexts, "ms": rows}


def interference(server: Server, tokens: list[int], prefill: dict[str, Any],
                 decode: dict[str, Any]) -> dict[str, Any]:
    alone_step = decode["ms"][0][0]
    factors = []
    for column, total in enumerate(tokens):
        started = threading.Event()
        with ThreadPoolExecutor(max_workers=1) as pool:
            stream = pool.submit(server.token_times, server.prompt(16), STREAM_TOKENS, started)
            started.wait(TIMEOUT_S)
            server.complete(server.prompt(total), 1)
            times = stream.result()
        if len(times) < 3:
            raise GateError(f"{server.url}: a stream of {STREAM_TOKENS} tokens came in {len(times)} chunks")
        worst_gap = max(b - a for a, b in zip(times, times[1:], strict=False)) * 1000
        alone = prefill["ms"][0][column] + alone_step
        factors.append(round(max(worst_gap / alone, 1e-3), 3))
        emit("progress", stage="interference", tokens=total, factor=factors[-1])
    return {"tokens": tokens, "factor": factors}


def decode_step(server: Server, batch: int, context: int, tokens: int = DECODE_TOKENS) -> float:
    # A small model's step is a few milliseconds, within the noise of a busy machine: a pair
    # where the longer answer came no later is taken again before it counts as an error.
    for _ in range(DECODE_ATTEMPTS):
        one = concurrently(server, batch, context, 1)
        many = concurrently(server, batch, context, tokens)
        if many > one:
            return (many - one) / (tokens - 1)
    raise GateError(f"{server.url}: {tokens} tokens took no longer than one "
                    f"(batch {batch}, context {context}), {DECODE_ATTEMPTS} times")


def neighbour(server: Server, other: Server, decode: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The step alone and beside the busy neighbour, each over answers of ``NEIGHBOUR_STEP_TOKENS``
    (longer than the grid's: the neighbour's load makes a short pair noisy)."""
    batch, context = decode["batch"][-1], decode["context"][0]
    alone = statistics.median(decode_step(server, batch, context, NEIGHBOUR_STEP_TOKENS)
                              for _ in range(repeats))
    stop = threading.Event()

    def keep_busy() -> int:
        done = 0
        while not stop.is_set():
            done += other.complete(other.prompt(context), NEIGHBOUR_TOKENS)
        return done

    with ThreadPoolExecutor(max_workers=batch) as pool:
        busy = [pool.submit(keep_busy) for _ in range(batch)]
        try:
            other.complete(other.prompt(8), 1)  # the neighbour is up and its batch admitted
            steps = [decode_step(server, batch, context, NEIGHBOUR_STEP_TOKENS)
                     for _ in range(repeats)]
        finally:
            stop.set()
        tokens = sum(future.result() for future in busy)  # a failed neighbour raises here
    if not tokens:
        raise GateError(f"{other.url}: the neighbour generated no tokens while measured beside")
    factor = round(max(statistics.median(steps) / alone, 1e-3), 3)
    emit("progress", stage="neighbour", batch=batch, context=context, factor=factor)
    return {"factor": factor}


def handoff(kv_dir: Path, bytes_per_token: int, tokens: list[int]) -> dict[str, Any]:
    kv_dir.mkdir(parents=True, exist_ok=True)
    path = kv_dir / f"advisor-handoff-{os.getpid()}.bin"
    ms = []
    try:
        for total in tokens:
            payload = os.urandom(total * bytes_per_token)
            begun = time.perf_counter()
            with path.open("wb") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            path.read_bytes()
            ms.append(round((time.perf_counter() - begun) * 1000, 3))
            emit("progress", stage="handoff", tokens=total, ms=ms[-1])
    finally:
        path.unlink(missing_ok=True)
    return {"tokens": tokens, "ms": ms}


def measure(url: str, key: str | None, prompt_tokens: list[int], batches: list[int],
            contexts: list[int], repeats: int = 1, kv_dir: Path | None = None,
            kv_bytes_per_token: int | None = None, neighbour_url: str | None = None,
            neighbour_key: str | None = None) -> dict[str, Any]:
    """The speeds JSON of speeds.py, from the server at ``url`` (and ``neighbour_url``)."""
    with httpx.Client(timeout=TIMEOUT_S, headers=bearer(key)) as client:
        server = Server(client, url)
        server.complete(server.prompt(8), 4)  # a cold server's first request pays one-time costs
        prefill = prefill_grid(server, batches, prompt_tokens, repeats)
        decode = decode_grid(server, batches, contexts)
        speeds: dict[str, Any] = {"prefill_ms": prefill, "decode_step_ms": decode,
                                  "interference": interference(server, prompt_tokens, prefill, decode)}
        if neighbour_url is not None:
            with httpx.Client(timeout=TIMEOUT_S, headers=bearer(neighbour_key)) as other_client:
                speeds["neighbour"] = neighbour(server, Server(other_client, neighbour_url), decode,
                                                repeats)
    if kv_dir is not None and kv_bytes_per_token:
        speeds["handoff_ms"] = handoff(kv_dir, kv_bytes_per_token, prompt_tokens)
    return speeds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.advisor measure",
        description="Measure a running vLLM server's prefill, decode-step and interference speeds "
                    f"through its HTTP API; print them as JSON. Its key, if any, in ${KEY_ENV}.")
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8300")
    parser.add_argument("--prompt-tokens", type=sizes, default=[128, 512, 1024])
    parser.add_argument("--batches", type=sizes, default=[1, 4])
    parser.add_argument("--contexts", type=sizes, default=[128, 1024])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--key-file", type=Path, help=f"a file holding the server's key (or ${KEY_ENV})")
    parser.add_argument("--neighbour-url", help="a second server of the same model on another core: "
                                                "measure how much it slows this one's steps")
    parser.add_argument("--neighbour-key-file", type=Path, help="a file holding the second server's key")
    parser.add_argument("--kv-dir", type=Path, help="the shared-storage KV channel's directory")
    parser.add_argument("--kv-bytes-per-token", type=int,
                        help="the model's KV cache bytes per token (all layers, K and V)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if len(args.prompt_tokens) < 2:
        emit("error", field="--prompt-tokens", message="needs at least two prompt lengths")
        return 2
    try:
        key = args.key_file.read_text().strip() if args.key_file else os.environ.get(KEY_ENV)
        neighbour_key = (args.neighbour_key_file.read_text().strip()
                         if args.neighbour_key_file else None)
        speeds = measure(args.url.rstrip("/"), key or None, args.prompt_tokens,
                         args.batches, args.contexts, max(args.repeats, 1), args.kv_dir,
                         args.kv_bytes_per_token,
                         args.neighbour_url.rstrip("/") if args.neighbour_url else None,
                         neighbour_key or None)
    except (GateError, httpx.HTTPError, OSError) as exc:
        emit("error", message=str(exc))
        return 2
    emit("result", speeds=speeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
