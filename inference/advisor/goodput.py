"""Latency percentiles and goodput of a simulated run, as vLLM's benchmark client reports them.

- TTFT, E2E and TPOT per request; TPOT = (E2E - TTFT) / (output tokens - 1), only for answers
  of more than one token (a one-token answer meets any TPOT SLO, as in vLLM's goodput).
- ITL pooled over all requests' token gaps. The simulator emits one token per step per request,
  so nothing is coalesced into a chunk as a streaming server may do.
- Percentiles by numpy's linear interpolation: p50, p90, p99.
- Goodput (vLLM's definition): requests meeting both the TTFT and TPOT SLOs over the run's
  duration, at the load's offered rate; ``attained`` is their fraction of all requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference.advisor.simulate import Outcome

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class Summary:
    ttft_ms: tuple[float, ...]  # at PERCENTILES
    tpot_ms: tuple[float, ...]
    itl_ms: tuple[float, ...]
    e2e_ms: tuple[float, ...]
    goodput_rps: float
    attained: float
    requests: int


def meets_slo(outcome: Outcome, slo: Slo) -> np.ndarray:
    tpot_ok = np.isnan(outcome.tpot_s) | (outcome.tpot_s * 1000 <= slo.tpot_ms)
    return (outcome.ttft_s * 1000 <= slo.ttft_ms) & tpot_ok


def percentiles_ms(seconds: np.ndarray) -> tuple[float, ...]:
    values = seconds[~np.isnan(seconds)] * 1000
    if not len(values):
        return tuple(float("nan") for _ in PERCENTILES)
    return tuple(float(v) for v in np.percentile(values, PERCENTILES))


def summarize(outcome: Outcome, slo: Slo) -> Summary:
    good = int(meets_slo(outcome, slo).sum())
    return Summary(
        ttft_ms=percentiles_ms(outcome.ttft_s), tpot_ms=percentiles_ms(outcome.tpot_s),
        itl_ms=percentiles_ms(outcome.itl_s), e2e_ms=percentiles_ms(outcome.e2e_s),
        goodput_rps=good / outcome.duration_s if outcome.duration_s > 0 else 0.0,
        attained=good / len(outcome.ttft_s), requests=len(outcome.ttft_s))
