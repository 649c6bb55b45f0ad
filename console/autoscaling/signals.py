"""A pool's signal, per instance, from what the alert evaluator reads too: the collector's 1 s
snapshots (as console/alerts/snapshots.py turns them into frames, and the alert series read
them), and the router's histograms (as the rollout analysis reads them).

Each reading carries its inputs, which the decision stores: the series values, the instances
they were divided by, and the window they were averaged over.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from console.alerts import series as catalog
from console.alerts.snapshots import frame
from console.rollouts import analysis
from console.rollouts.analysis import Scrape

# Snapshots averaged into one reading: a few seconds, so that one scrape's spike is not a load.
SAMPLE_S = 10.0
# The router's TTFT and TPOT histograms are read over this window for the SLO signal.
SLO_WINDOW_S = 30.0
SLO_QUANTILE = 0.9
# The measured prefill speed when the router has not measured one (pd_policy remote): the
# fastest a pool's instance computed prompts over this window.
SPEED_WINDOW_S = 120.0


@dataclass(frozen=True)
class Reading:
    value: float | None    # per instance; None: no data
    inputs: dict[str, Any]


@dataclass
class History:
    """One deployment's recent frames and router scrapes, as the autoscaler keeps them."""

    frames: deque[catalog.Frame] = field(default_factory=deque)
    scrapes: deque[tuple[float, Scrape]] = field(default_factory=deque)
    last_sample_id: int = 0

    def add_samples(self, rows: Iterable[tuple[int, float, dict[str, Any]]],
                    planned: dict[str, Any], starting: set[str],
                    ready_since: dict[str, float]) -> None:
        previous = self.frames[-1] if self.frames else None
        for sample_id, at, data in rows:
            self.last_sample_id = sample_id
            previous = frame(at, data.get("processes", {}), planned, starting, {}, previous,
                             ready_since)
            self.frames.append(previous)

    def add_scrape(self, at: float, text: str) -> None:
        if self.scrapes and self.scrapes[-1][0] >= at:
            return
        self.scrapes.append((at, analysis.merged(analysis.parse(text))))

    def trim(self, now: float) -> None:
        keep = max(SAMPLE_S, SLO_WINDOW_S, SPEED_WINDOW_S) + 5
        while self.frames and self.frames[0].at < now - keep:
            self.frames.popleft()
        while self.scrapes and self.scrapes[0][0] < now - keep:
            self.scrapes.popleft()

    def recent(self, now: float, seconds: float) -> list[catalog.Frame]:
        return [f for f in self.frames if f.at > now - seconds]


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _per_frame(definition: catalog.SeriesDef, frames: list[catalog.Frame], role: str
               ) -> list[tuple[float, list[float]]]:
    """(time, the pool's instances' values) per frame, by the alert series' own reader."""
    by_time: dict[float, list[float]] = {}
    for _instance, points in catalog.instance_points(definition, frames, role).items():
        for at, value in points:
            by_time.setdefault(at, []).append(value)
    return sorted(by_time.items())


def read(signal: str, role: str, history: History, now: float, ready: int,
         ttft_slo_s: float, tpot_slo_s: float) -> Reading:
    frames = history.recent(now, SAMPLE_S)
    inputs: dict[str, Any] = {"ready": ready, "sample_s": SAMPLE_S, "snapshots": len(frames)}
    if ready <= 0:
        return Reading(None, {**inputs, "why": "no ready instance"})
    if signal == "queue":
        totals = [math.fsum(v) for _, v in _per_frame(catalog.SERIES["worker.waiting"], frames,
                                                      role)]
        waiting = _mean(totals)
        return _divided(waiting, ready, {**inputs, "waiting": waiting})
    if signal == "kv_usage":
        means = [math.fsum(v) / len(v) for _, v in _per_frame(catalog.SERIES["worker.kv_usage"],
                                                              frames, role)]
        usage = _mean(means)
        return Reading(None if usage is None else round(usage, 4), {**inputs, "kv_usage": usage})
    if signal == "concurrency":
        totals = [_in_flight(f, role) for f in frames if "router" in f.processes]
        in_flight = _mean([t for t in totals if t is not None])
        return _divided(in_flight, ready, {**inputs, "in_flight": in_flight})
    if signal == "prompt_backlog":
        return _backlog(history, frames, now, ready, inputs)
    if signal == "slo":
        return _slo(history, now, ttft_slo_s, tpot_slo_s, inputs)
    raise ValueError(f"unknown signal {signal!r}")


def _divided(total: float | None, ready: int, inputs: dict[str, Any]) -> Reading:
    if total is None:
        return Reading(None, {**inputs, "why": "no snapshot has the series"})
    return Reading(round(total / ready, 4), inputs)


def _in_flight(snapshot: catalog.Frame, role: str) -> float | None:
    in_flight = snapshot.processes["router"].get("in_flight")
    if in_flight is None:
        return None
    # A colocated pool is the router's decode pool.
    backends = in_flight.get(role) or (in_flight.get("decode") if role == "colocated" else None)
    return float(sum((backends or {}).values()))


def _backlog(history: History, frames: list[catalog.Frame], now: float, ready: int,
             inputs: dict[str, Any]) -> Reading:
    """Seconds the pool needs for the prompts in flight: tokens / (speed per instance * ready)."""
    routers = [f.processes["router"] for f in frames if "router" in f.processes]
    tokens = _mean([float(r["prefill_tokens_in_flight"]) for r in routers
                    if r.get("prefill_tokens_in_flight") is not None])
    speed = max((float(r["prefill_speed"]) for r in routers if r.get("prefill_speed")),
                default=0.0)
    source = "router (pd_adaptive's measured prefill speed)"
    if not speed:
        measured = [max(v) for _, v in _per_frame(catalog.SERIES["worker.prompt_tps"],
                                                  history.recent(now, SPEED_WINDOW_S), "prefill")]
        speed = max(measured, default=0.0)
        source = f"the fastest instance's prompt tokens/s over {SPEED_WINDOW_S:g} s"
    inputs = {**inputs, "tokens_in_flight": tokens, "tokens_per_s": round(speed, 1),
              "speed_from": source}
    if tokens is None:
        return Reading(None, {**inputs, "why": "the router exports no prompt backlog"})
    if tokens == 0:
        return Reading(0.0, inputs)
    if not speed:
        return Reading(None, {**inputs, "why": "no prefill speed measured yet"})
    return Reading(round(tokens / (speed * ready), 4), inputs)


def _slo(history: History, now: float, ttft_slo_s: float, tpot_slo_s: float,
         inputs: dict[str, Any]) -> Reading:
    """max(TTFT p90 / SLO, TPOT p90 / SLO) over the router's last window; 0 without requests
    (an idle pool meets its SLO)."""
    scrapes = [s for s in history.scrapes if s[0] >= now - SLO_WINDOW_S - 5]
    inputs = {**inputs, "slo_window_s": SLO_WINDOW_S, "quantile": SLO_QUANTILE,
              "ttft_slo_s": ttft_slo_s, "tpot_slo_s": tpot_slo_s}
    if len(scrapes) < 2:
        return Reading(None, {**inputs, "why": "fewer than two router scrapes in the window"})
    (start, before), (end, after) = scrapes[0], scrapes[-1]
    measures = analysis.window(before, after, analysis.ALL, quantile=SLO_QUANTILE)
    ttft, tpot = measures["ttft_p95"], measures["tpot_p95"]
    inputs.update(ttft_p90_s=ttft, tpot_p90_s=tpot, requests=measures["requests"],
                  over_s=round(end - start, 1))
    ratios = [value / slo for value, slo in ((ttft, ttft_slo_s), (tpot, tpot_slo_s))
              if value is not None]
    return Reading(round(max(ratios), 4) if ratios else 0.0, inputs)
