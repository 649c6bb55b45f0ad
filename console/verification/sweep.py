"""Performance: a sweep over input length x concurrency, sized to the plan and a time budget,
timed as vLLM's benchmark client times it (console/verification/streaming.py); whether TTFT
grows faster than linearly with the input (prefill the bottleneck) and whether decode's
waiting queue stays bounded."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from console.verification.footprint import samples_since, series
from console.verification.streaming import completion_body, filler_prompt, run_batch, summarise
from console.verification.subject import Subject
from console.verification.verdicts import FAIL, PASS, WARN, Section
from inference.worker_auth import bearer

REQUEST_TIMEOUT_S = 120.0
# The sweep's longest input: half the context, and no more than this (a 2-core box prefills
# ~700 tokens/s on the default model).
LONGEST_INPUT = 1024
SHORTEST_INPUT = 32
# TTFT grows "faster than linearly" when its slope over the longest inputs is this many times
# its slope over the shortest.
SUPERLINEAR = 1.5


@dataclass(frozen=True)
class SweepSize:
    """How many input lengths and concurrency levels; each point sends ``per_slot`` requests
    per concurrent slot."""

    lengths: int = 3
    concurrencies: int = 2
    output_tokens: int = 16
    per_slot: int = 2


def _spread(low: int, high: int, count: int) -> list[int]:
    """``count`` values from ``low`` to ``high``, evenly spaced on a log scale."""
    if count <= 1 or high <= low:
        return [high]
    ratio = (high / low) ** (1 / (count - 1))
    return sorted({round(low * ratio ** i) for i in range(count)})


def grid(subject: Subject, size: SweepSize) -> tuple[list[int], list[int]]:
    longest = max(SHORTEST_INPUT, min(LONGEST_INPUT,
                                      (subject.max_model_len - size.output_tokens) // 2))
    return (_spread(SHORTEST_INPUT, longest, size.lengths),
            _spread(1, max(1, subject.concurrency), size.concurrencies))


def ttft_slopes(points: list[dict[str, Any]]) -> list[float]:
    """TTFT p50 growth in ms per 1,000 prompt tokens between successive lengths, at
    concurrency 1."""
    single = sorted((p for p in points if p["concurrency"] == 1 and p.get("ttft_ms_p50") is not None
                     and p.get("mean_prompt_tokens")), key=lambda p: p["mean_prompt_tokens"])
    slopes = []
    for a, b in zip(single, single[1:], strict=False):
        tokens = b["mean_prompt_tokens"] - a["mean_prompt_tokens"]
        if tokens > 0:
            slopes.append(round((b["ttft_ms_p50"] - a["ttft_ms_p50"]) * 1000 / tokens, 2))
    return slopes


def concurrency_growth(points: list[dict[str, Any]]) -> dict[str, float]:
    """Per input length: TTFT p50 at the highest concurrency over TTFT p50 at the lowest, how
    much requests wait for prefill when they arrive together."""
    growth: dict[str, float] = {}
    for length in sorted({p["input_words"] for p in points}):
        by_level = {p["concurrency"]: p.get("ttft_ms_p50") for p in points
                    if p["input_words"] == length}
        low, high = by_level.get(min(by_level)), by_level.get(max(by_level))
        if max(by_level) > min(by_level) and low and high:
            growth[str(length)] = round(high / low, 2)
    return growth


def queue_stability(samples: list[dict[str, dict[str, Any]]], slots: list[str],
                    bound: int) -> dict[str, Any]:
    """The summed waiting queue of ``slots`` over the samples: its peak, its last value, and
    whether it stayed bounded (peak within ``bound``, or drained back to half its peak)."""
    totals = [sum(float(sample.get(slot, {}).get("waiting") or 0) for slot in slots)
              for sample in samples]
    if not totals:
        return {"samples": 0}
    peak, last = max(totals), totals[-1]
    return {"samples": len(totals), "peak": peak, "last": last,
            "bounded": peak <= bound or last <= peak / 2}


def performance(subject: Subject, size: SweepSize, deadline: float, seed: int) -> Section:
    section = Section("performance")
    lengths, levels = grid(subject, size)
    started = timezone.now()
    points: list[dict[str, Any]] = []
    url = f"{subject.router_url}/v1/completions"
    for concurrency in levels:
        for length in lengths:
            count = max(2, concurrency * size.per_slot)
            bodies = [completion_body(subject.model, filler_prompt(length, seed + n),
                                      size.output_tokens) for n in range(count)]
            seed += count
            if time.monotonic() >= deadline:
                points.append({"input_words": length, "concurrency": concurrency,
                               "skipped": "time budget"})
                continue
            outcomes, duration = asyncio.run(run_batch(url, bearer(subject.api_key), bodies,
                                                       concurrency, REQUEST_TIMEOUT_S, deadline))
            points.append({"input_words": length, "concurrency": concurrency,
                           **summarise(outcomes, duration)})
    samples = samples_since(subject.deployment_id, started)
    section.numbers = {"points": points, "lengths": lengths, "concurrencies": levels,
                       "output_tokens": size.output_tokens,
                       "load": _load(subject, samples)}
    _judge(subject, section, points, samples)
    return section


def _load(subject: Subject, samples: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per worker over the sweep: CPU (% of a core), running and waiting requests, peaks."""
    load: dict[str, Any] = {}
    for worker in subject.workers:
        cpu = series(samples, worker.slot, "cpu")
        load[worker.slot] = {
            "role": worker.role,
            "cpu_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "cpu_max": max(cpu, default=None),
            "running_max": max(series(samples, worker.slot, "running"), default=None),
            "waiting_max": max(series(samples, worker.slot, "waiting"), default=None)}
    return load


def _judge(subject: Subject, section: Section, points: list[dict[str, Any]],
           samples: list[dict[str, dict[str, Any]]]) -> None:
    ran = [p for p in points if "skipped" not in p]
    failed = sum(p["failed"] for p in ran)
    sent = sum(p["requests"] for p in ran)
    if not ran:
        section.add("sweep", FAIL, "the time budget left no room for the sweep")
        return
    section.add("sweep requests", FAIL if failed else PASS,
                f"{failed} of {sent} sweep requests failed" if failed
                else f"{sent} sweep requests over {len(ran)} points completed",
                errors=sorted({e for p in ran for e in p.get("errors", [])})[:5])
    skipped = [p for p in points if "skipped" in p]
    if skipped:
        section.add("sweep size", WARN, f"the time budget cut {len(skipped)} of {len(points)} "
                    "sweep points", skipped=[(p["input_words"], p["concurrency"]) for p in skipped])
    first = min(ran, key=lambda p: (p["concurrency"], p["input_words"]))
    for name, slo in (("ttft_ms_p50", subject.ttft_slo_ms), ("tpot_ms_p50", subject.tpot_slo_ms)):
        value = first.get(name)
        if value is not None:
            section.add(name, WARN if value > slo else PASS,
                        f"{name.split('_')[0].upper()} p50 {value:.0f} ms at concurrency "
                        f"{first['concurrency']}, {first['input_words']} words (SLO {slo} ms)",
                        value=value, slo_ms=slo)
    slopes = ttft_slopes(ran)
    superlinear = len(slopes) >= 2 and slopes[0] > 0 and slopes[-1] > SUPERLINEAR * slopes[0]
    section.numbers["ttft_slopes_ms_per_1k_tokens"] = slopes
    section.numbers["prefill_superlinear"] = superlinear
    section.numbers["ttft_growth_with_concurrency"] = concurrency_growth(ran)
    if slopes:
        section.add("prefill scaling", WARN if superlinear else PASS,
                    ("TTFT grows faster than linearly with the input (ms per 1k tokens: "
                     f"{slopes}): prefill becomes the bottleneck on long inputs") if superlinear
                    else f"TTFT grows about linearly with the input (ms per 1k tokens: {slopes})",
                    slopes=slopes)
    decode = [w.slot for w in subject.workers if w.role in ("decode", "colocated")]
    queue = queue_stability(samples, decode, max(1, subject.concurrency))
    section.numbers["decode_queue"] = queue
    if not queue.get("samples"):
        section.add("decode queue", WARN, "no metric samples during the sweep: decode's queue "
                    "is unknown")
    else:
        section.add("decode queue", PASS if queue["bounded"] else WARN,
                    f"decode's waiting queue peaked at {queue['peak']:.0f} and ended at "
                    f"{queue['last']:.0f}" + ("" if queue["bounded"] else ": it does not drain"),
                    **queue)
