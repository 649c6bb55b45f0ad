"""Green beside blue over one window: the router's per-revision counters and histograms read
twice, and the difference judged against the rollout's limits.

Every limit is absolute (``max``) or relative to blue over the same window (``max_ratio``). A
side with fewer requests than the minimum makes the window inconclusive, which holds the step:
never a pass. Quantiles come from the histograms' buckets as Prometheus' histogram_quantile
computes them (linear within the bucket).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

REQUESTS = "pdserve_router_requests_total"
HANDOFF_FAILURES = "pdserve_router_handoff_failures_total"
HANDOFFS = "pdserve_router_kv_handoff_seconds_count"
LATENCIES = {"ttft_p95": "pdserve_router_ttft_seconds", "itl_p95": "pdserve_router_itl_seconds",
             "tpot_p95": "pdserve_router_tpot_seconds"}
QUANTILE = 0.95
# The revision label of a scrape whose revisions are summed (``merged``).
ALL = "*"

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


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
    scrape = Scrape()
    histograms = {f"{name}_bucket": metric for metric, name in LATENCIES.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            revision = sample.labels.get("revision")
            if revision is None:
                continue
            counts = scrape.counts.setdefault(revision, {})
            if sample.name == REQUESTS:
                counts["requests"] = counts.get("requests", 0.0) + sample.value
                if sample.labels.get("status", "").startswith("5"):
                    counts["errors"] = counts.get("errors", 0.0) + sample.value
            elif sample.name == HANDOFFS:
                counts["handoffs"] = counts.get("handoffs", 0.0) + sample.value
            elif sample.name == HANDOFF_FAILURES:
                counts["handoff_failures"] = counts.get("handoff_failures", 0.0) + sample.value
            elif sample.name in histograms:
                rows = scrape.buckets.setdefault(revision, {}).setdefault(
                    histograms[sample.name], [])
                rows.append((float(sample.labels["le"]), sample.value))
    for by_metric in scrape.buckets.values():
        for rows in by_metric.values():
            rows.sort()
    return scrape


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative ``(upper bound, count)`` rows."""
    rows = sorted(buckets)
    if not rows or rows[-1][1] <= 0:
        return None
    rank = q * rows[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in rows:
        if count >= rank:
            if math.isinf(bound):
                return lower  # the highest finite bound, as Prometheus answers
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


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
        old = dict(before.buckets.get(revision, {}).get(metric, []))
        rows = [(bound, count - old.get(bound, 0.0))
                for bound, count in after.buckets.get(revision, {}).get(metric, [])]
        values[metric] = histogram_quantile(quantile, rows)
    return values


@dataclass(frozen=True)
class Judgement:
    verdict: str
    metrics: dict[str, dict[str, Any]]
    requests: dict[str, float]


def judge(before: Scrape, after: Scrape, blue: str, green: str, config: dict[str, Any],
          baseline: dict[str, float | None] | None = None) -> Judgement:
    """The window's verdict. ``baseline``: blue's measures from an earlier window, for a step
    where blue takes no traffic (green at 100%)."""
    green_values = window(before, after, green)
    blue_values = window(before, after, blue)
    minimum = config["min_requests"]
    requests = {blue: blue_values["requests"] or 0.0, green: green_values["requests"] or 0.0}
    if baseline is not None and requests[blue] < minimum:
        blue_values, requests[blue] = baseline, float(baseline.get("requests") or 0.0)
    results: dict[str, dict[str, Any]] = {}
    for name, limits in config["metrics"].items():
        results[name] = _judge_metric(name, limits, green_values.get(name), blue_values.get(name),
                                      green_ok=requests[green] >= minimum,
                                      blue_ok=requests[blue] >= minimum)
    verdicts = {r["verdict"] for r in results.values()}
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
