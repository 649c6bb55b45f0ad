"""Streamed requests timed as vLLM's benchmark client times them (shared/notes/metrics.md).

- ``st`` is taken just before the POST (``time.perf_counter()``);
- TTFT: the first SSE message whose ``choices`` is non-empty, minus ``st``;
- ITL: the gaps between successive ``choices`` messages, per message, pooled over requests;
- E2EL: the last ``choices`` message minus ``st`` (the usage message and ``[DONE]`` excluded);
- output tokens: ``usage.completion_tokens`` when reported; TPOT per request:
  (E2EL - TTFT) / (output tokens - 1), only with more than one output token;
- duration: start of the run to the last completion; failed requests are counted and left out
  of the latency statistics; percentiles by numpy's linear interpolation.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy

PERCENTILES = (50, 90, 99)
FAILED_PAUSE_S = 0.1
# Common words that most BPE vocabularies hold as one token each with their leading space.
WORDS = ("the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "with",
         "as", "his", "they", "be", "at", "one", "have", "this", "from", "by", "hot", "word",
         "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when")


@dataclass
class Outcome:
    """One request: its timings (seconds), or why it failed."""

    ok: bool = False
    ttft: float | None = None
    e2el: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""
    error: str = ""
    timeout: bool = False
    events: int = 0

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft is None or self.e2el is None:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def filler_prompt(words: int, seed: int) -> str:
    """About ``words`` tokens of text, different from its first word on for every ``seed``: no
    two requests share a prefix, so no prefix-cache hit makes a TTFT look short."""
    rng = random.Random(seed)
    return f"{seed}: " + " ".join(rng.choice(WORDS) for _ in range(max(1, words - 2)))


def _piece(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                 headers: dict[str, str]) -> Outcome:
    """POST ``body`` (streamed, with usage) and time its messages."""
    outcome = Outcome()
    parts: list[str] = []
    st = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", errors="replace")
                outcome.error = f"HTTP {response.status_code}: {detail[:300]}"
                return outcome
            # Per SSE message: keep the work here small.
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    outcome.ok = not outcome.error
                    break
                now = time.perf_counter()
                message = json.loads(data)
                outcome.events += 1
                if "error" in message:
                    outcome.error = f"error event: {str(message['error'])[:300]}"
                    return outcome
                usage = message.get("usage")
                if isinstance(usage, dict):
                    outcome.output_tokens = int(usage.get("completion_tokens") or 0)
                    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                choices = message.get("choices")
                if not choices:
                    continue
                if last is None:
                    outcome.ttft = now - st
                else:
                    outcome.itl.append(now - last)
                last = now
                parts.append(_piece(choices[0]))
                outcome.finish_reason = choices[0].get("finish_reason") or outcome.finish_reason
    except httpx.TimeoutException as exc:
        outcome.timeout, outcome.error = True, f"timed out: {type(exc).__name__}"
        return outcome
    except (httpx.HTTPError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        return outcome
    if not outcome.ok and not outcome.error:
        outcome.error = "the stream ended without [DONE]"
    outcome.e2el = None if last is None else last - st
    outcome.text = "".join(parts)
    if outcome.ok and not outcome.output_tokens:
        outcome.output_tokens = len(outcome.itl) + (outcome.ttft is not None)
    return outcome


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed completion of exactly ``max_tokens`` tokens, as the benchmark's random
    dataset sends (``ignore_eos``)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def run_batch(url: str, headers: dict[str, str], bodies: list[dict[str, Any]],
                    concurrency: int, timeout_s: float, deadline: float
                    ) -> tuple[list[Outcome], float]:
    """Send ``bodies`` with at most ``concurrency`` in flight, none started after ``deadline``
    (``time.monotonic()``): (outcomes of those sent, duration from the first send to the last
    completion)."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0),
                                 limits=limits) as client:

        async def one(body: dict[str, Any]) -> Outcome | None:
            async with gate:
                if time.monotonic() >= deadline:
                    return None
                return await stream(client, url, body, headers)

        start = time.perf_counter()
        sent = await asyncio.gather(*(one(body) for body in bodies))
        duration = time.perf_counter() - start
    return [o for o in sent if o is not None], duration


async def hold(url: str, headers: dict[str, str], body: Callable[[int], dict[str, Any]],
               concurrency: int, seconds: float, timeout_s: float) -> tuple[list[Outcome], float]:
    """Keep ``concurrency`` requests in flight for ``seconds``: each slot sends its next
    request when its last one ends. (outcomes, duration)."""
    stop = time.monotonic() + seconds
    outcomes: list[Outcome] = []
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0),
                                 limits=limits) as client:

        async def slot() -> None:
            while time.monotonic() < stop:
                outcome = await stream(client, url, body(next(counter)), headers)
                outcomes.append(outcome)
                if not outcome.ok:
                    # A refused connection fails at once: without a pause the slot would spin.
                    await asyncio.sleep(FAILED_PAUSE_S)

        start = time.perf_counter()
        await asyncio.gather(*(slot() for _ in range(concurrency)))
        duration = time.perf_counter() - start
    return outcomes, duration


def _ms_percentiles(values: list[float], name: str) -> dict[str, float | None]:
    if not values:
        return {f"{name}_p{q}": None for q in PERCENTILES}
    found = numpy.percentile(numpy.array(values) * 1000.0, PERCENTILES)
    return {f"{name}_p{q}": round(float(v), 2) for q, v in zip(PERCENTILES, found, strict=True)}


def summarise(outcomes: list[Outcome], duration: float) -> dict[str, Any]:
    """The benchmark client's numbers of a run (latencies in ms, throughput per second)."""
    done = [o for o in outcomes if o.ok]
    output = sum(o.output_tokens for o in done)
    numbers: dict[str, Any] = {
        "requests": len(outcomes), "completed": len(done), "failed": len(outcomes) - len(done),
        "timeouts": sum(o.timeout for o in outcomes),
        "duration_s": round(duration, 3),
        "request_throughput": round(len(done) / duration, 3) if duration > 0 else None,
        "output_throughput": round(output / duration, 2) if duration > 0 else None,
        "mean_prompt_tokens": round(sum(o.prompt_tokens for o in done) / len(done), 1)
        if done else None,
    }
    numbers.update(_ms_percentiles([o.ttft for o in done if o.ttft is not None], "ttft_ms"))
    numbers.update(_ms_percentiles([t for o in done if (t := o.tpot) is not None], "tpot_ms"))
    numbers.update(_ms_percentiles([gap for o in done for gap in o.itl], "itl_ms"))
    numbers.update(_ms_percentiles([o.e2el for o in done if o.e2el is not None], "e2el_ms"))
    errors = sorted({o.error for o in outcomes if o.error})
    if errors:
        numbers["errors"] = errors[:5]
    return numbers
