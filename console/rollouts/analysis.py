"""Green beside blue over one window: the router's per-revision counters and histograms read
twice, and the difference judged against the rollout's limits.

Every limit is absolute (``max``) or relative to blue over the same window (``max_ratio``). A
side with fewer requests than the minimum makes the window inconclusive, which holds the step:
never a pass. The text is read and the quantiles computed by inference/prom_text.py, as the
dashboard's snapshots and the alerts read them: Prometheus' histogram_quantile over the buckets'
increase in the window (a router restarted within it counts from zero, as ``rate()`` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from inference import prom_text
from inference.prom_text import histogram_quantile

REQUESTS = "pdserve_router_requests_total"
HANDOFF_FAILURES = "pdserve_router_handoff_failures_total"
HANDOFFS = "pdserve_router_kv_handoff_seconds_count"
LATENCIES = {"ttft_p95": "pdserve_router_ttft_seconds", "itl_p95": "pdserve_router_itl_seconds",
             "tpot_p95": "pdserve_router_tpot_seconds"}
QUANTILE = 0.95
# The revision label of a scrape whose revisions are summed (``merged``).
ALL = "*"
# The router's /metrics lines the analysis reads (the parser reads only these).
_WANTED = (REQUESTS, HANDOFF_FAILURES, HANDOFFS,
           *(f"{name}_bucket" for name in LATENCIES.values()))

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
# A metric's row only: a limit that cannot apply in this window (see judge's blue_serves).
SKIPPED = "skipped"


@dataclass
class Scrape:
    """One reading of the router's /metrics: per revision, the counters the analysis needs."""

    # revision -> {"requests", "errors", "handoffs", "handoff_failures"}
    counts: dict[str, dict[str, float]] = field(default_factory=dict)
    # revision -> metric -> [(upper bound, cumulative count)]
    buckets: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)

    def count(self, revision: str, name: str) -> float:
        return self.counts.get(revision, {}).get(name, 0.0)

    def as_json(self) -> dict[str, Any]:
        return {"counts": self.counts,
                "buckets": {rev: {m: [[_bound(b), c] for b, c in rows] for m, rows in by.items()}
                            for rev, by in self.buckets.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scrape:
        return cls(counts=data.get("counts", {}), buckets={
            rev: {m: [(float(b), c) for b, c in rows] for m, rows in by.items()}
            for rev, by in data.get("buckets", {}).items()})


def _bound(value: float) -> float | str:
    return "+Inf" if math.isinf(value) else value


def parse(text: str) -> Scrape:
    """The router's per-revision counters and latency buckets (summed by revision and ``le``);
    samples without a ``revision`` label are not a revision's."""
    scrape = Scrape()
    samples = prom_text.samples(text, _WANTED)
    for name, key in ((REQUESTS, "requests"), (HANDOFFS, "handoffs"),
                      (HANDOFF_FAILURES, "handoff_failures")):
        for labels, value in samples.get(name, []):
            revision = labels.get("revision")
            if revision is None:
                continue
            counts = scrape.counts.setdefault(revision, {})
            counts[key] = counts.get(key, 0.0) + value
            if name == REQUESTS and labels.get("status", "").startswith("5"):
                counts["errors"] = counts.get("errors", 0.0) + value
    for metric, name in LATENCIES.items():
        series = [(labels, value) for labels, value in samples.get(f"{name}_bucket", [])
                  if "revision" in labels]
        for (revision,), rows in prom_text.histograms(series, by=("revision",)).items():
            scrape.counts.setdefault(revision, {})
            scrape.buckets.setdefault(revision, {})[metric] = rows
    return scrape


def merged(scrape: Scrape) -> Scrape:
    """The scrape with every revision's counters and buckets summed under ``ALL``."""
    counts: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for by_name in scrape.counts.values():
        for name, value in by_name.items():
            counts[name] = counts.get(name, 0.0) + value
    for by_metric in scrape.buckets.values():
        for metric, rows in by_metric.items():
            summed = buckets.setdefault(metric, {})
            for bound, count in rows:
                summed[bound] = summed.get(bound, 0.0) + count
    return Scrape(counts={ALL: counts},
                  buckets={ALL: {m: sorted(rows.items()) for m, rows in buckets.items()}})


def window(before: Scrape, after: Scrape, revision: str,
           quantile: float = QUANTILE) -> dict[str, float | None]:
    """The revision's measures over the window between two scrapes; the latency measures are
    the ``quantile`` (named as the analysis names them, p95)."""
    def delta(name: str) -> float:
        return max(0.0, after.count(revision, name) - before.count(revision, name))

    requests = delta("requests")
    handoffs = delta("handoffs") + delta("handoff_failures")
    values: dict[str, float | None] = {
        "requests": requests,
        "error_rate": delta("errors") / requests if requests else None,
        "handoff_failure_rate": delta("handoff_failures") / handoffs if handoffs else 0.0,
    }
    for metric in LATENCIES:
        rows = prom_text.increase(before.buckets.get(revision, {}).get(metric, []),
                                  after.buckets.get(revision, {}).get(metric, []))
        values[metric] = histogram_quantile(quantile, rows)
    return values


@dataclass(frozen=True)
class Judgement:
    verdict: str
    metrics: dict[str, dict[str, Any]]
    requests: dict[str, float]


def judge(before: Scrape, after: Scrape, blue: str, green: str, config: dict[str, Any],
          baseline: dict[str, float | None] | None = None,
          blue_serves: bool = True) -> Judgement:
    """The window's verdict. ``baseline``: blue's measures from an earlier window, for a step
    where blue takes no traffic (green at 100%). ``blue_serves``: False when blue takes no
    traffic and no baseline exists (blue-green's one step): the limits relative to blue are
    then skipped (a row of their own), never an inconclusive window forever."""
    green_values = window(before, after, green)
    blue_values = window(before, after, blue)
    minimum = config["min_requests"]
    requests = {blue: blue_values["requests"] or 0.0, green: green_values["requests"] or 0.0}
    if baseline is not None and requests[blue] < minimum:
        blue_values, requests[blue] = baseline, float(baseline.get("requests") or 0.0)
    compare = blue_serves or baseline is not None
    results: dict[str, dict[str, Any]] = {}
    for name, limits in config["metrics"].items():
        if not compare:
            limits = {k: v for k, v in limits.items() if k != "max_ratio"}
            if not limits:
                results[name] = {"green": green_values.get(name), "blue": None,
                                 "verdict": SKIPPED, "why": "relative to blue, who takes no "
                                 "traffic and had no window with enough requests"}
                continue
        results[name] = _judge_metric(name, limits, green_values.get(name), blue_values.get(name),
                                      green_ok=requests[green] >= minimum,
                                      blue_ok=requests[blue] >= minimum)
    verdicts = {r["verdict"] for r in results.values()} - {SKIPPED}
    verdict = FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS
    return Judgement(verdict, results, requests)


def _judge_metric(name: str, limits: dict[str, float], green: float | None, blue: float | None,
                  green_ok: bool, blue_ok: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"green": green, "blue": blue}
    if not green_ok or green is None:
        return {**row, "verdict": INCONCLUSIVE, "why": "too few green requests in the window"}
    bounds: list[tuple[float, str]] = []
    if "max" in limits:
        bounds.append((limits["max"], f"at most {limits['max']:g}"))
    if "max_ratio" in limits:
        if not blue_ok or blue is None:
            return {**row, "verdict": INCONCLUSIVE, "why": "too few blue requests to compare with"}
        # A ratio of a near-zero blue would refuse any green: 1 ms is the floor compared with.
        reference = max(blue, 0.001) if name.endswith("_p95") else blue
        bounds.append((reference * limits["max_ratio"],
                       f"at most {limits['max_ratio']:g} x blue ({reference:.4g})"))
    limit = min(bound for bound, _ in bounds)
    row["limit"] = limit
    why = " and ".join(text for _, text in bounds)
    if green > limit:
        return {**row, "verdict": FAIL, "why": f"{green:.4g} > {limit:.4g} ({why})"}
    return {**row, "verdict": PASS, "why": f"{green:.4g} <= {limit:.4g} ({why})"}
