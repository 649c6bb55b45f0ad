"""Compact numbers from two consecutive Prometheus scrapes of one process.

The console's collector scrapes every vLLM worker and the router once a second; the dashboard
needs a few rates, gauges and latency quantiles per process, not the whole exposition. Rates and
quantiles are taken over the interval between the two scrapes, the way Prometheus' ``rate()``
and ``histogram_quantile()`` would over a window of that length: a counter that went backwards
was reset (the process restarted) and counts from zero, and quantiles are Prometheus'
``histogram_quantile`` of the buckets' increase. Text and quantiles are read in
inference/prom_text.py, as the rollout analysis and the console's re-export read them.

Metric names are what vLLM 0.32 (``vllm/v1/metrics/loggers.py``, NIXL's ``nixl/stats.py``) and
pdserve's router (``inference/router/metrics.py``) put in the text: counters carry ``_total``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from inference import prom_text
from inference.prom_text import Labels, Series, histogram_quantile

# vLLM worker
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
TTFT = "vllm:time_to_first_token_seconds"
# Per request (E2EL - TTFT) / (output tokens - 1): the benchmark's TPOT. Inter-token latency
# (per step, pooled) stands in only where a vLLM build lacks the per-request histogram.
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"
NIXL_BYTES = "vllm:nixl_bytes_transferred"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"

# pdserve router
ROUTER_REQUESTS = "pdserve_router_requests_total"
ROUTER_FIRST_BYTE = "pdserve_router_first_byte_seconds"
ROUTER_PREFILL = "pdserve_router_prefill_seconds"
ROUTER_KV_HANDOFF = "pdserve_router_kv_handoff_seconds"
ROUTER_IN_FLIGHT = "pdserve_router_in_flight"
ROUTER_FALLBACK = "pdserve_router_pd_fallback_total"
ROUTER_BACKEND_ERRORS = "pdserve_router_backend_errors_total"
ROUTER_HANDOFFS = "pdserve_router_kv_handoffs_total"
ROUTER_PREFILL_BACKLOG = "pdserve_router_prefill_tokens_in_flight"
ROUTER_PREFILL_SPEED = "pdserve_router_prefill_tokens_per_second"

# A vLLM scrape is 20-40 KB, mostly families nobody charts here; only lines starting with
# these names reach the (pure Python) parser, which keeps a 1 s scrape of many workers cheap.
_WANTED = (
    RUNNING, WAITING, KV_USAGE, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS,
    f"{TTFT}_bucket", f"{TPOT}_bucket", f"{ITL}_bucket",
    f"{NIXL_XFER_TIME}_bucket", f"{NIXL_BYTES}_sum", NIXL_FAILED,
    "pdserve_router_",
)


@dataclass(frozen=True)
class Scrape:
    """The samples of one scrape that the snapshot uses, by sample name; ``at`` in seconds."""

    at: float
    samples: dict[str, Series]

    def has(self, name: str) -> bool:
        return name in self.samples

    def sum(self, name: str) -> float | None:
        series = self.samples.get(name)
        return None if series is None else math.fsum(value for _, value in series)

    def mean(self, name: str) -> float | None:
        series = self.samples.get(name)
        return None if not series else math.fsum(value for _, value in series) / len(series)


def parse(text: str, at: float) -> Scrape:
    """Parse the wanted samples of a Prometheus text exposition taken at ``at`` seconds."""
    return Scrape(at=at, samples=prom_text.samples(text, _WANTED))


def _key(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _counter_deltas(prev: Scrape, cur: Scrape, name: str) -> list[tuple[Labels, float]]:
    """Per-series increase between the scrapes; a series new in ``cur`` counts from zero."""
    before = {_key(labels): value for labels, value in prev.samples.get(name, [])}
    deltas = []
    for labels, value in cur.samples.get(name, []):
        old = before.get(_key(labels), 0.0)
        deltas.append((labels, value - old if value >= old else value))
    return deltas


def _rate(prev: Scrape | None, cur: Scrape, name: str) -> float | None:
    if prev is None or cur.at <= prev.at:
        return None
    return math.fsum(delta for _, delta in _counter_deltas(prev, cur, name)) / (cur.at - prev.at)


def _rates_by(prev: Scrape | None, cur: Scrape, name: str, label: str) -> dict[str, float] | None:
    if prev is None or cur.at <= prev.at:
        return None
    by: dict[str, float] = defaultdict(float)
    for labels, delta in _counter_deltas(prev, cur, name):
        by[labels.get(label, "")] += delta / (cur.at - prev.at)
    return {key: _round(value, 3) for key, value in sorted(by.items())}


def _interval_buckets(prev: Scrape, cur: Scrape, histogram: str) -> list[tuple[float, float]]:
    """Cumulative buckets of the observations made between the scrapes, summed over series."""
    name = f"{histogram}_bucket"
    series: dict[tuple[tuple[str, str], ...], list[list[prom_text.Bucket]]] = defaultdict(
        lambda: [[], []])
    for index, scrape in enumerate((prev, cur)):
        for labels, value in scrape.samples.get(name, []):
            series[prom_text.bucket_key(labels)][index].append((float(labels["le"]), value))
    summed: dict[float, float] = defaultdict(float)
    for before, after in series.values():
        # One bucket going backwards means the whole histogram was reset.
        for bound, count in prom_text.increase(before, after):
            summed[bound] += count
    return sorted(summed.items())


def _quantiles(prev: Scrape | None, cur: Scrape, histogram: str,
               qs: tuple[float, ...] = (0.5, 0.95)) -> list[float | None]:
    if prev is None:
        return [None] * len(qs)
    buckets = _interval_buckets(prev, cur, histogram)
    return [_round(histogram_quantile(q, buckets), 6) for q in qs]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def worker_stats(prev: Scrape | None, cur: Scrape) -> dict[str, Any]:
    """A vLLM worker's numbers; rates and quantiles are None on the first scrape."""
    running, waiting = cur.sum(RUNNING), cur.sum(WAITING)
    ttft_p50, ttft_p95 = _quantiles(prev, cur, TTFT)
    tpot_p50, tpot_p95 = _quantiles(prev, cur, TPOT if cur.has(f"{TPOT}_bucket") else ITL)
    stats: dict[str, Any] = {
        "running": None if running is None else int(running),
        "waiting": None if waiting is None else int(waiting),
        # Per engine, 1.0 = full; engines of one server (data parallel) are averaged.
        "kv_usage": _round(cur.mean(KV_USAGE), 4),
        "prompt_tps": _round(_rate(prev, cur, PROMPT_TOKENS), 2),
        "gen_tps": _round(_rate(prev, cur, GENERATION_TOKENS), 2),
        "rps": _round(_rate(prev, cur, REQUEST_SUCCESS), 3),
        "ttft_p50": ttft_p50, "ttft_p95": ttft_p95,
        "tpot_p50": tpot_p50, "tpot_p95": tpot_p95,
    }
    # NIXL metrics exist only on workers whose KV channel is NIXL, and only after a transfer.
    if cur.has(f"{NIXL_XFER_TIME}_bucket") or cur.has(NIXL_FAILED):
        stats["nixl_xfer_p50"] = _quantiles(prev, cur, NIXL_XFER_TIME, (0.5,))[0]
        stats["nixl_bytes_ps"] = _round(_rate(prev, cur, f"{NIXL_BYTES}_sum"), 1)
        stats["nixl_failed_ps"] = _round(_rate(prev, cur, NIXL_FAILED), 3)
    return stats


def router_stats(prev: Scrape | None, cur: Scrape) -> dict[str, Any]:
    """The router's numbers: client-facing rates and latencies, the KV hand-off, in-flight."""
    ttft_p50, ttft_p95 = _quantiles(prev, cur, ROUTER_FIRST_BYTE)
    handoff_p50, handoff_p95 = _quantiles(prev, cur, ROUTER_PREFILL)
    # The hand-off alone: prefill's answer to decode's first token, no prompt computed in it.
    [kv_handoff_p95] = _quantiles(prev, cur, ROUTER_KV_HANDOFF, (0.95,))
    in_flight: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in cur.samples.get(ROUTER_IN_FLIGHT, []):
        in_flight[labels.get("role", "")][labels.get("backend", "")] = int(value)
    by_status = _rates_by(prev, cur, ROUTER_REQUESTS, "status")
    stats: dict[str, Any] = {
        "rps": None if by_status is None else _round(math.fsum(by_status.values()), 3),
        "rps_by_status": by_status,
        "ttft_p50": ttft_p50, "ttft_p95": ttft_p95,
        "handoff_p50": handoff_p50, "handoff_p95": handoff_p95, "kv_handoff_p95": kv_handoff_p95,
        "fallback_ps": _round(_rate(prev, cur, ROUTER_FALLBACK), 3),
        "in_flight": dict(in_flight),
        "backend_errors_ps": _backend_error_rates(prev, cur),
        # Summed over revision groups; the speed is per prefill worker (one prompt at a time),
        # the fastest group's, 0 until measured.
        "prefill_tokens_in_flight": cur.sum(ROUTER_PREFILL_BACKLOG),
        "prefill_speed": max((value for labels, value in cur.samples.get(ROUTER_PREFILL_SPEED, [])
                              if labels.get("where") == "remote"), default=None),
    }
    if cur.has(ROUTER_HANDOFFS):
        stats["handoffs"] = handoff_pairs(prev, cur)
    return stats


def _backend_error_rates(prev: Scrape | None, cur: Scrape) -> dict[str, float] | None:
    """Failed backend calls per second by ``"<role> <kind>"``, only the kinds that occurred."""
    if prev is None or cur.at <= prev.at:
        return None
    rates: dict[str, float] = defaultdict(float)
    for labels, delta in _counter_deltas(prev, cur, ROUTER_BACKEND_ERRORS):
        if delta > 0:
            rates[f"{labels.get('role', '')} {labels.get('kind', '')}"] += delta / (cur.at - prev.at)
    return {key: round(value, 3) for key, value in sorted(rates.items())}


def handoff_pairs(prev: Scrape | None, cur: Scrape) -> list[dict[str, Any]]:
    """KV hand-offs per prefill -> decode pair: totals, and failures in this interval."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    failed_now: dict[tuple[str, str], float] = defaultdict(float)
    if prev is not None:
        for labels, delta in _counter_deltas(prev, cur, ROUTER_HANDOFFS):
            if labels.get("outcome") == "failed":
                failed_now[(labels.get("prefill", ""), labels.get("decode", ""))] += delta
    for labels, value in cur.samples.get(ROUTER_HANDOFFS, []):
        pair = (labels.get("prefill", ""), labels.get("decode", ""))
        row = pairs.setdefault(pair, {"prefill": pair[0], "decode": pair[1], "ok": 0, "failed": 0})
        outcome = labels.get("outcome", "")
        if outcome in ("ok", "failed"):
            row[outcome] += int(value)
    for pair, row in pairs.items():
        row["failed_now"] = int(failed_now.get(pair, 0.0))
    return [pairs[pair] for pair in sorted(pairs)]


def process_stats(role: str, prev: Scrape | None, cur: Scrape) -> dict[str, Any]:
    """The snapshot of one process: the router's numbers or a vLLM worker's."""
    return router_stats(prev, cur) if role == "router" else worker_stats(prev, cur)
