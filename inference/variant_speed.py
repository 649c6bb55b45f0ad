"""How fast one vLLM server prefills and decodes: the numbers the plan page's advice and
``bench/quant.py`` compare variants by.

- prefill: a prompt of exactly ``tokens`` token ids (built from the gate's prompts, so any
  tokenizer works), ``max_tokens: 1``, wall time; each repetition starts with a different token so
  vLLM's prefix cache never serves it;
- decode: one request of ``max_tokens`` tokens (``ignore_eos``) against one of a single token with
  the same prompt: the extra tokens over the extra time.

    python -m inference.variant_speed --url http://127.0.0.1:8300 --prefill-tokens 512
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass

import httpx

from inference.output_gate import PROMPTS_FILE, GateError, served_model
from inference.worker_auth import bearer

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Speed:
    prefill_tokens: int
    prefill_ms: float  # median
    prefill_tps: float
    decode_tokens: int
    decode_tps: float


def prompt_ids(client: httpx.Client, url: str, model: str, tokens: int) -> list[int]:
    """Exactly ``tokens`` token ids of English text, from the server's own tokenizer."""
    text = "\n\n".join(json.loads(PROMPTS_FILE.read_text()))
    response = client.post(f"{url}/tokenize", json={"model": model, "prompt": text,
                                                     "add_special_tokens": False})
    if response.status_code != 200:
        raise GateError(f"{url}/tokenize: HTTP {response.status_code}: {response.text[:200]}")
    ids = list(response.json()["tokens"])
    if not ids:
        raise GateError(f"{url}/tokenize: no tokens")
    while len(ids) < tokens:
        ids += ids
    return ids[:tokens]


def prefill_ms(client: httpx.Client, url: str, model: str, ids: list[int], repeats: int = 3) -> float:
    """Median wall time of a prompt with one output token, after one warm-up."""
    times = []
    for repeat in range(repeats + 1):
        # A different first token each time: no prefix-cache hit, the whole prompt is computed.
        prompt = [ids[(repeat * 7919) % len(ids)], *ids[1:]]
        started = time.perf_counter()
        complete(client, url, model, 1, prompt)
        elapsed = time.perf_counter() - started
        if repeat:
            times.append(elapsed * 1000)
    return statistics.median(times)


def complete(client: httpx.Client, url: str, model: str, max_tokens: int,
             prompt: list[int] | None = None) -> int:
    """One greedy completion of exactly ``max_tokens`` tokens; returns how many came."""
    response = client.post(f"{url}/v1/completions", json={
        "model": model, "prompt": prompt or "Once upon a time", "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True})
    if response.status_code != 200:
        raise GateError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
    return int(response.json()["usage"]["completion_tokens"])


def warm_up(client: httpx.Client, url: str, model: str) -> None:
    """A short completion, untimed and unjudged: a server's first requests pay one-time costs
    (a cold one-token request has been seen to take longer than a warm eight-token one)."""
    complete(client, url, model, 8)


def decode_tps(client: httpx.Client, url: str, model: str, max_tokens: int = 128,
               prompt: list[int] | None = None) -> float:
    """Single-stream decode speed: the extra tokens of a ``max_tokens`` request over a one-token
    request with the same short prompt, divided by the extra time. (Timing a stream's chunks
    undercounts: a fast server coalesces several tokens into one chunk.)"""

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        generated = complete(client, url, model, tokens, prompt)
        return time.perf_counter() - started, generated

    one, _ = timed(1)
    many, generated = timed(max_tokens)
    if generated < 2 or many <= one:
        raise GateError(f"{url}: {generated} tokens in {many:.3f} s against {one:.3f} s for one")
    return (generated - 1) / (many - one)


def measure(url: str, prefill_tokens: int = 512, decode_tokens: int = 128,
            key: str | None = None) -> Speed:
    """``key``: the server's key (inference/worker_auth.py), when it has one."""
    with httpx.Client(timeout=TIMEOUT_S, headers=bearer(key)) as client:
        model = served_model(client, url)
        ids = prompt_ids(client, url, model, prefill_tokens)
        warm_up(client, url, model)
        ms = prefill_ms(client, url, model, ids)
        tps = decode_tps(client, url, model, decode_tokens)
    return Speed(prefill_tokens, ms, prefill_tokens / (ms / 1000), decode_tokens, tps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.variant_speed",
                                     description="Measure one vLLM server's prefill and decode speed.")
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8300")
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    for flag in ("prefill_tokens", "decode_tokens"):
        if getattr(args, flag) < 2:
            parser.error(f"--{flag.replace('_', '-')}: expected at least 2")
    try:
        speed = measure(args.url.rstrip("/"), args.prefill_tokens, args.decode_tokens)
    except (GateError, httpx.HTTPError) as exc:
        print(f"variant speed: {exc}")
        return 2
    print(json.dumps(asdict(speed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
