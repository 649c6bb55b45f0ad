"""One reading of the Prometheus text exposition format, and one ``histogram_quantile``.

The router's snapshots (inference/prom_snapshot.py), the rollout analysis
(console/rollouts/analysis.py) and the console's re-export (console/live/metrics_export.py)
all read scrapes here, with ``prometheus_client``'s own text parser, and every latency quantile
pdserve shows, judges or alerts on comes from ``histogram_quantile`` below: one histogram has
one reading, whichever page or rule looks at it.

``histogram_quantile`` is Prometheus' definition for classic histograms (``BucketQuantile`` in
promql/quantile.go), case for case; where Prometheus answers NaN this answers None. This module
is the data plane's: it may not import Django (the console imports it).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]
Series = list[tuple[Labels, float]]
# (upper bound ``le``, cumulative count)
Bucket = tuple[float, float]

# promql/quantile.go: relative differences between neighbouring buckets below this are float
# noise, evened out silently.
SMALL_DELTA_TOLERANCE = 1e-12
_MIN_NORMAL = sys.float_info.min  # the smallest positive normal float64


def families(text: str, prefixes: tuple[str, ...] = ()) -> Iterator[Metric]:
    """The metric families of a text exposition, as ``prometheus_client`` parses them.

    With ``prefixes`` only the sample lines starting with one of them are read, without the
    ``# HELP``/``# TYPE`` lines: each sample name is then an untyped family of its own, under the
    name it has on the wire. A vLLM scrape is 20-40 KB, mostly families the caller does not
    read, and the parser is pure Python: filtering first keeps a 1 s scrape of many workers cheap.
    """
    if prefixes:
        text = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
    return iter(text_string_to_metric_families(text))


def samples(text: str, prefixes: tuple[str, ...] = ()) -> dict[str, Series]:
    """Every sample of the exposition (or of the lines starting with ``prefixes``), by sample
    name (``x_bucket``, ``x_total`` ... as written), each as ``(labels, value)``."""
    by_name: dict[str, Series] = defaultdict(list)
    for family in families(text, prefixes):
        for sample in family.samples:
            by_name[sample.name].append((dict(sample.labels), float(sample.value)))
    return dict(by_name)


def bucket_key(labels: Labels, without: Iterable[str] = ("le",)) -> tuple[tuple[str, str], ...]:
    """The identity of one series of a histogram: its labels but ``le``, sorted."""
    skip = set(without)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in skip))


def histograms(series: Series, by: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[Bucket]]:
    """``x_bucket`` samples summed by ``le`` and the ``by`` labels, as PromQL's
    ``sum by (le, <by>) (x_bucket)``: per value of ``by`` (a missing label is ""), the cumulative
    buckets sorted by upper bound. ``le`` is read as Prometheus reads it (``+Inf``, ``1e0`` and
    ``1.0`` are numbers), so one bound written two ways is one bucket."""
    summed: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in series:
        summed[tuple(labels.get(name, "") for name in by)][float(labels["le"])] += value
    return {key: sorted(rows.items()) for key, rows in summed.items()}


def increase(before: Iterable[Bucket], after: Iterable[Bucket]) -> list[Bucket]:
    """The observations of one histogram series between two readings of its buckets.

    A bucket that went backwards means the histogram was reset (its process restarted): the
    later reading then counts from zero, as ``rate()`` reads a reset. A bucket missing from
    ``before`` counts from zero.
    """
    old = dict(before)
    rows = sorted(after)
    if any(count < old.get(bound, 0.0) for bound, count in rows):
        return rows
    return [(bound, count - old.get(bound, 0.0)) for bound, count in rows]


def histogram_quantile(q: float, buckets: Iterable[Bucket]) -> float | None:
    """Prometheus' ``histogram_quantile(q, ...)`` over one histogram's cumulative buckets.

    As promql/quantile.go defines it: buckets sorted by upper bound, one bound given twice is
    one bucket (counts summed); the highest bucket must be ``+Inf``; counts that go down from
    one bucket to the next are raised to the envelope (and float noise evened out); the rank
    ``q`` x observations is found in the first bucket whose count reaches it and interpolated
    linearly inside it, from 0 in the lowest bucket when its upper bound is above 0 (otherwise
    that bound is the answer); a rank in the ``+Inf`` bucket answers the second-highest bound.

    None where Prometheus answers NaN: ``q`` NaN, no ``+Inf`` bucket, fewer than two buckets,
    no observations (or a 0/0 interpolation, ``q`` = 0 over an empty lowest bucket).
    ``q`` < 0 answers -Inf and ``q`` > 1 +Inf, as Prometheus does.
    """
    if math.isnan(q):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    rows = _coalesced(sorted(buckets, key=lambda row: row[0]))
    if not rows or rows[-1][0] != math.inf:
        return None
    _ensure_monotonic(rows)
    if len(rows) < 2:
        return None
    observations = rows[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    # sort.Search over all buckets but +Inf: the first whose count reaches the rank.
    b = next((i for i in range(len(rows) - 1) if rows[i][1] >= rank), len(rows) - 1)
    if b == len(rows) - 1:
        return rows[-2][0]
    if b == 0 and rows[0][0] <= 0:
        return rows[0][0]
    start, end, count = 0.0, rows[b][0], rows[b][1]
    if b > 0:
        start = rows[b - 1][0]
        count -= rows[b - 1][1]
        rank -= rows[b - 1][1]
    if count == 0:
        return None  # 0/0: Prometheus' NaN
    return start + (end - start) * (rank / count)


def _coalesced(rows: list[Bucket]) -> list[list[float]]:
    merged: list[list[float]] = []
    for bound, count in rows:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([float(bound), float(count)])
    return merged


def _ensure_monotonic(rows: list[list[float]]) -> None:
    """promql/quantile.go's ensureMonotonicAndIgnoreSmallDeltas, in place."""
    prev = rows[0][1] if rows else 0.0
    for row in rows[1:]:
        current = row[1]
        if current == prev:
            continue
        if _almost_equal(prev, current, SMALL_DELTA_TOLERANCE) or current < prev:
            row[1] = prev  # 'prev' stays: the difference is ignored
            continue
        prev = current


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus' util/almost.Equal for finite counts."""
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < epsilon * _MIN_NORMAL
    return diff / min(abs_sum, sys.float_info.max) < epsilon
