"""inference/prom_text.py against Prometheus' own definition of histogram_quantile.

The classic-histogram cases of Prometheus' promql/promqltest/testdata/histograms.test, with the
series' values at the instant each case evaluates (``0+5x10`` at 50m is 50; a ``rate()`` over
the last 10m divides every bucket by the same number, which no quantile sees), read from text
as the scrapes are.
"""

from __future__ import annotations

import math

import pytest

from inference.prom_text import families, histogram_quantile, histograms, increase, samples

INF = math.inf

# testhistogram at 50m: two histograms of one name, the lowest bound of one below 0.
TESTHISTOGRAM = """\
# TYPE testhistogram histogram
testhistogram_bucket{le="0.1", start="positive"} 50
testhistogram_bucket{le=".2", start="positive"} 70
testhistogram_bucket{le="1e0", start="positive"} 110
testhistogram_bucket{le="+Inf", start="positive"} 120
testhistogram_bucket{le="-.2", start="negative"} 10
testhistogram_bucket{le="-0.1", start="negative"} 20
testhistogram_bucket{le="0.3", start="negative"} 20
testhistogram_bucket{le="+Inf", start="negative"} 30
"""

# testhistogram3 at 50m: no observation in the +Inf bucket, a 0 (and a -0.25) lowest bound.
TESTHISTOGRAM3 = """\
testhistogram3_bucket{le="0", start="positive"} 0
testhistogram3_bucket{le="0.1", start="positive"} 50
testhistogram3_bucket{le=".2", start="positive"} 70
testhistogram3_bucket{le="1e0", start="positive"} 110
testhistogram3_bucket{le="+Inf", start="positive"} 110
testhistogram3_bucket{le="-.25", start="negative"} 0
testhistogram3_bucket{le="-.2", start="negative"} 10
testhistogram3_bucket{le="-0.1", start="negative"} 20
testhistogram3_bucket{le="0.3", start="negative"} 20
testhistogram3_bucket{le="+Inf", start="negative"} 20
"""

# testhistogram2 at 7m: q(1/6), q(1/2), q(5/6) each in the middle of a bucket.
TESTHISTOGRAM2 = [(0.0, 0.0), (2.0, 1.0), (4.0, 2.0), (6.0, 3.0), (INF, 3.0)]

# request_duration_seconds at 50m, per job and instance.
REQUEST_DURATION = """\
request_duration_seconds_bucket{job="job1", instance="ins1", le="0.1"} 10
request_duration_seconds_bucket{job="job1", instance="ins1", le="0.2"} 30
request_duration_seconds_bucket{job="job1", instance="ins1", le="+Inf"} 40
request_duration_seconds_bucket{job="job1", instance="ins2", le="0.1"} 20
request_duration_seconds_bucket{job="job1", instance="ins2", le="0.2"} 50
request_duration_seconds_bucket{job="job1", instance="ins2", le="+Inf"} 60
request_duration_seconds_bucket{job="job2", instance="ins1", le="0.1"} 30
request_duration_seconds_bucket{job="job2", instance="ins1", le="0.2"} 40
request_duration_seconds_bucket{job="job2", instance="ins1", le="+Inf"} 60
request_duration_seconds_bucket{job="job2", instance="ins2", le="0.1"} 40
request_duration_seconds_bucket{job="job2", instance="ins2", le="0.2"} 70
request_duration_seconds_bucket{job="job2", instance="ins2", le="+Inf"} 90
"""

# mixed at 50m: one bound written three ways.
MIXED = """\
mixed_bucket{job="job1", instance="ins1", le="0.1"} 10
mixed_bucket{job="job1", instance="ins1", le="0.2"} 10
mixed_bucket{job="job1", instance="ins1", le="2e-1"} 10
mixed_bucket{job="job1", instance="ins1", le="2.0e-1"} 10
mixed_bucket{job="job1", instance="ins1", le="+Inf"} 40
mixed_bucket{job="job1", instance="ins2", le="+inf"} 0
mixed_bucket{job="job1", instance="ins2", le="+Inf"} 0
"""

# nonmonotonic at 50m (loaded with plain `load`: recording rules or federation racing a scrape).
NONMONOTONIC = [(0.1, 20.0), (1.0, 10.0), (10.0, 50.0), (100.0, 40.0), (1000.0, 90.0), (INF, 80.0)]


def _by(text: str, name: str, *labels: str) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    return histograms(samples(text).get(f"{name}_bucket", []), by=labels)


def _q(q: float, text: str, name: str, *labels: str) -> dict[tuple[str, ...], float | None]:
    return {key: histogram_quantile(q, rows) for key, rows in _by(text, name, *labels).items()}


@pytest.mark.parametrize(("q", "positive", "negative"), [
    (0, 0.0, -0.2),        # quantile value in the lowest bucket
    (1, 1.0, 0.3),         # in the highest bucket: the second-highest bound
    (0.2, 0.048, -0.2),
    (0.5, 0.15, -0.15),
    (0.8, 0.72, 0.3),      # negative: the rank lies in the +Inf bucket
])
def test_testhistogram(q: float, positive: float, negative: float) -> None:
    got = _q(q, TESTHISTOGRAM, "testhistogram", "start")
    assert got[("positive",)] == pytest.approx(positive)
    assert got[("negative",)] == pytest.approx(negative)


@pytest.mark.parametrize(("q", "positive", "negative"), [
    (0, 0.0, -0.25), (0.25, 0.055, -0.225), (0.5, 0.125, -0.2), (0.75, 0.45, -0.15),
    (1, 1.0, -0.1),
])
def test_testhistogram3(q: float, positive: float, negative: float) -> None:
    got = _q(q, TESTHISTOGRAM3, "testhistogram3", "start")
    assert got[("positive",)] == pytest.approx(positive)
    assert got[("negative",)] == pytest.approx(negative)


@pytest.mark.parametrize("q", [-0.1, 1.01, math.nan])
def test_quantile_out_of_range(q: float) -> None:
    # Prometheus: -Inf below 0, +Inf above 1, NaN for NaN (None here), whatever the buckets.
    for rows in _by(TESTHISTOGRAM, "testhistogram", "start").values():
        got = histogram_quantile(q, rows)
        if math.isnan(q):
            assert got is None
        else:
            assert got == (-INF if q < 0 else INF)


@pytest.mark.parametrize(("q", "want"), [(1 / 6, 1.0), (0.5, 3.0), (5 / 6, 5.0)])
def test_middle_of_the_bucket(q: float, want: float) -> None:
    assert histogram_quantile(q, TESTHISTOGRAM2) == pytest.approx(want)
    assert histogram_quantile(q, [(b, c / 900) for b, c in TESTHISTOGRAM2]) == pytest.approx(want)


@pytest.mark.parametrize(("q", "by", "want"), [
    (0.3, (), {(): 0.075}),
    (0.5, (), {(): 0.1277777777777778}),
    (0.3, ("instance",), {("ins1",): 0.075, ("ins2",): 0.075}),
    (0.5, ("instance",), {("ins1",): 0.1333333333, ("ins2",): 0.125}),
    (0.3, ("job",), {("job1",): 0.1, ("job2",): 0.0642857142857143}),
    (0.5, ("job",), {("job1",): 0.14, ("job2",): 0.1125}),
    (0.3, ("job", "instance"), {("job1", "ins1"): 0.11, ("job1", "ins2"): 0.09,
                                ("job2", "ins1"): 0.06, ("job2", "ins2"): 0.0675}),
    (0.5, ("job", "instance"), {("job1", "ins1"): 0.15, ("job1", "ins2"): 0.1333333333333333,
                                ("job2", "ins1"): 0.1, ("job2", "ins2"): 0.1166666666666667}),
])
def test_aggregated_sum_by_le(q: float, by: tuple[str, ...], want: dict) -> None:
    got = _q(q, REQUEST_DURATION, "request_duration_seconds", *by)
    assert got == {key: pytest.approx(value) for key, value in want.items()}


@pytest.mark.parametrize(("q", "want"), [(0.01, 0.0045), (0.5, 8.5), (0.99, 979.75)])
def test_nonmonotonic_counts_are_fixed(q: float, want: float) -> None:
    assert histogram_quantile(q, NONMONOTONIC) == pytest.approx(want)


@pytest.mark.parametrize(("q", "want"), [(0.5, 0.15), (0.75, 0.2), (1, 0.2)])
def test_one_bound_written_several_ways_is_one_bucket(q: float, want: float) -> None:
    got = _q(q, MIXED, "mixed", "instance")
    assert got[("ins1",)] == pytest.approx(want)
    assert got[("ins2",)] is None  # no observations
    # Coalesced by the quantile itself too, as Prometheus does after a sum that kept both.
    rows = [(0.1, 10.0), (0.2, 10.0), (0.2, 10.0), (0.2, 10.0), (INF, 40.0)]
    assert histogram_quantile(q, rows) == pytest.approx(want)


def test_empty_histograms_answer_none() -> None:
    # empty_bucket, and const_histogram's rate (zero in every bucket): NaN in Prometheus.
    assert histogram_quantile(0.2, [(0.1, 0.0), (0.2, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(1.0, [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_the_inf_bucket() -> None:
    # Required: without it Prometheus answers NaN, whatever the finite buckets hold.
    assert histogram_quantile(0.5, [(0.1, 3.0), (0.2, 5.0)]) is None
    # Fewer than two buckets: NaN, even with observations.
    assert histogram_quantile(0.5, [(INF, 7.0)]) is None
    # A rank in the +Inf bucket answers the second-highest bound, never an extrapolation.
    assert histogram_quantile(0.95, [(0.1, 0.0), (0.2, 1.0), (INF, 10.0)]) == 0.2
    assert histogram_quantile(0.99, [(1.0, 50.0), (2.0, 98.0), (INF, 100.0)]) == 2.0
    # The rank exactly at a finite bucket's count stays in that bucket.
    assert histogram_quantile(0.98, [(1.0, 50.0), (2.0, 98.0), (INF, 100.0)]) == 2.0


def test_interpolation_in_the_lowest_bucket() -> None:
    # From 0 when its upper bound is above 0 ...
    assert histogram_quantile(0.5, [(1.0, 4.0), (INF, 4.0)]) == pytest.approx(0.5)
    assert histogram_quantile(0.25, [(0.2, 10.0), (1.0, 20.0), (INF, 20.0)]) == pytest.approx(0.1)
    # ... its upper bound itself when that is 0 or below.
    assert histogram_quantile(0.25, [(-1.0, 10.0), (1.0, 20.0), (INF, 20.0)]) == -1.0
    assert histogram_quantile(0.25, [(0.0, 10.0), (1.0, 20.0), (INF, 20.0)]) == 0.0
    # q = 0 over an empty lowest bucket above 0 is 0/0 in Prometheus: NaN.
    assert histogram_quantile(0.0, [(0.1, 0.0), (0.2, 5.0), (INF, 10.0)]) is None


def test_float_noise_between_buckets_is_evened_out() -> None:
    noisy = [(1.0, 10.0), (2.0, 10.0 - 1e-14), (INF, 20.0)]
    assert histogram_quantile(0.5, noisy) == histogram_quantile(0.5, [(1.0, 10.0), (2.0, 10.0),
                                                                      (INF, 20.0)])


def test_increase_reads_a_reset_as_rate_does() -> None:
    before = [(0.1, 5.0), (1.0, 8.0), (INF, 9.0)]
    assert increase(before, [(0.1, 6.0), (1.0, 10.0), (INF, 12.0)]) == [(0.1, 1.0), (1.0, 2.0),
                                                                         (INF, 3.0)]
    # One bucket going backwards: the process restarted, its buckets count from zero.
    assert increase(before, [(0.1, 1.0), (1.0, 2.0), (INF, 2.0)]) == [(0.1, 1.0), (1.0, 2.0),
                                                                       (INF, 2.0)]
    assert increase([], [(1.0, 2.0), (INF, 3.0)]) == [(1.0, 2.0), (INF, 3.0)]


def test_prefixes_read_only_the_lines_asked_for() -> None:
    text = ("# HELP a_total A\n# TYPE a_total counter\na_total 3\n"
            "# TYPE b gauge\nb{x=\"1\"} 2\nb{x=\"2\"} 4\n")
    assert samples(text) == {"a_total": [({}, 3.0)], "b": [({"x": "1"}, 2.0), ({"x": "2"}, 4.0)]}
    assert samples(text, ("b",)) == {"b": [({"x": "1"}, 2.0), ({"x": "2"}, 4.0)]}
    typed = {family.name: family.type for family in families(text)}
    assert typed == {"a": "counter", "b": "gauge"}
