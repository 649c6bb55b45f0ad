"""The alert rules' aggregations and state machine over recorded series (console/alerts/rule_states.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from console.alerts.rule_states import (
    AGGREGATIONS,
    ALERTING_STATES,
    COMPARISONS,
    NODATA_POLICIES,
    InstanceState,
    Point,
    RatioPoint,
    RuleSpec,
    Transition,
    aggregate,
    aggregate_ratio,
    compare,
    replay,
    step,
)

EVERY_S = 5.0


def spec(comparison: str = ">", threshold: float = 0.5, for_s: float = 0.0,
         keep_firing_for_s: float = 0.0, min_count: float = 0.0, nodata: str = "nodata") -> RuleSpec:
    return RuleSpec(comparison, threshold, for_s, keep_firing_for_s, min_count, nodata)


def run(rule: RuleSpec, values: list[float | None], counts: list[float | None] | None = None
        ) -> tuple[list[str], list[Transition]]:
    """Steps one state through the values, one tick every 5 s from t=0: the state after each
    tick and the transitions."""
    state = InstanceState()
    states, transitions = [], []
    for i, value in enumerate(values):
        returned, change = step(rule, state, value, i * EVERY_S, None if counts is None else counts[i])
        assert returned is state  # documented: one state object per alert, mutated in place
        states.append(state.state)
        if change is not None:
            transitions.append(change)
    return states, transitions


def moves(transitions: list[Transition]) -> list[tuple[str, str, float]]:
    return [(t.from_state, t.to_state, t.at) for t in transitions]


# --- aggregate --------------------------------------------------------------------------------

# One point a second from t=1 to t=10, value = t.
SERIES: list[Point] = [(float(t), float(t)) for t in range(1, 11)]


@pytest.mark.parametrize(("aggregation", "window_s", "now", "expected"), [
    # The window is (now - window_s, now]: t=6 is out, t=10 is in, t=11.. would be future.
    ("avg", 4, 10, (7 + 8 + 9 + 10) / 4),
    ("max", 4, 10, 10.0),
    ("min", 4, 10, 7.0),
    ("last", 4, 10, 10.0),
    # A window ending in the past ignores what came after it.
    ("last", 3, 5, 5.0),
    ("max", 3, 5, 5.0),
    ("min", 3, 5, 3.0),
    ("avg", 100, 10, 5.5),
    ("rate", 4, 10, 1.0),
    ("absent", 4, 10, 0.0),
    # Nothing in (10, 15]: no data, except for absent.
    ("avg", 5, 15, None),
    ("max", 5, 15, None),
    ("min", 5, 15, None),
    ("last", 5, 15, None),
    ("rate", 5, 15, None),
    ("absent", 5, 15, 1.0),
    # One point: a rate needs two.
    ("rate", 1, 10, None),
    ("last", 1, 10, 10.0),
])
def test_aggregate_over_its_window(aggregation: str, window_s: float, now: float,
                                   expected: float | None) -> None:
    assert aggregate(SERIES, aggregation, window_s, now) == expected


def test_absent_is_never_no_data() -> None:
    assert aggregate([], "absent", 60, 100) == 1.0
    assert aggregate_ratio([], "absent", 60, 100) == (1.0, 0.0)


@pytest.mark.parametrize(("values", "expected"), [
    # Steady: 10 a second.
    ([0, 10, 20, 30, 40], 10.0),
    # Restarted after 20: the 5 counted since the restart are increase, not a drop of 15.
    ([0, 10, 20, 5, 15], (10 + 10 + 5 + 10) / 4),
    # Restarted twice, once to exactly zero.
    ([100, 110, 0, 4, 2], (10 + 0 + 4 + 2) / 4),
    ([7, 7, 7, 7, 7], 0.0),
])
def test_rate_counts_a_counter_reset_as_a_restart_from_zero(values: list[float], expected: float) -> None:
    points = [(float(t), float(v)) for t, v in enumerate(values)]
    assert aggregate(points, "rate", 60, 4) == pytest.approx(expected)


def test_rate_is_per_second_over_the_span_of_the_points() -> None:
    # Sampled every 5 s, +50 per sample: 10 a second whatever the sampling.
    points = [(float(t), 10.0 * t) for t in range(0, 61, 5)]
    assert aggregate(points, "rate", 30, 60) == pytest.approx(10.0)


@pytest.mark.parametrize("function", [aggregate, aggregate_ratio])
def test_unknown_aggregation_is_an_error_naming_it(function: Callable[..., object]) -> None:
    with pytest.raises(ValueError, match="'median'"):
        function([], "median", 60, 100)
    with pytest.raises(ValueError, match="'median'"):
        replay(spec(), [], "median", 60, 0, 10, EVERY_S)


# --- aggregate_ratio --------------------------------------------------------------------------

@pytest.mark.parametrize(("points", "aggregation", "expected_ratio", "expected_count"), [
    # One request failing in one second, 99 succeeding in the next: 1 in 100, not a mean of
    # per-second ratios (0.5).
    ([(1, 1, 1), (2, 0, 99)], "avg", 0.01, 100),
    ([(1, 1, 1), (2, 0, 99)], "rate", 0.01, 100),
    ([(1, 1, 1), (2, 0, 99)], "max", 1.0, 100),
    ([(1, 1, 1), (2, 0, 99)], "min", 0.0, 100),
    ([(1, 1, 1), (2, 0, 99)], "last", 0.0, 100),
    # Uneven gaps weigh each point by the time it covers: gaps 1 and 2, the first point takes
    # their median 1.5: errors 1.5 + 1 + 0, requests 3 + 2 + 4 (mean of ratios would be 1/3).
    ([(10, 1, 2), (11, 1, 2), (13, 0, 2)], "avg", 2.5 / 9, 9),
    # Alone, a point covers 1 s.
    ([(5, 3, 4)], "avg", 0.75, 4),
    # Points without requests are skipped by the per-point aggregations.
    ([(1, 0, 10), (2, 5, 10), (3, 0, 0)], "last", 0.5, 20),
    ([(1, 0, 10), (2, 5, 10), (3, 0, 0)], "min", 0.0, 20),
    ([(1, 2, 4), (2, 0, 0), (3, 1, 4)], "max", 0.5, 8),
    # No requests at all: no data, and a count of zero.
    ([(1, 0, 0), (2, 0, 0)], "avg", None, 0),
    ([(1, 0, 0), (2, 0, 0)], "last", None, 0),
    ([(1, 0, 0), (2, 0, 0)], "max", None, 0),
    ([], "avg", None, 0),
    ([(1, 0, 0), (2, 0, 0)], "absent", 0.0, 0),
    ([(1, 1, 3), (2, 1, 3)], "absent", 0.0, 6),
])
def test_aggregate_ratio(points: list[RatioPoint], aggregation: str, expected_ratio: float | None,
                         expected_count: float) -> None:
    ratio, count = aggregate_ratio(points, aggregation, 60, 13)
    assert count == pytest.approx(expected_count)
    if expected_ratio is None:
        assert ratio is None
    else:
        assert ratio == pytest.approx(expected_ratio)


def test_aggregate_ratio_only_counts_its_window() -> None:
    # (now - 3, now] holds t=8, 9, 10: 10 requests a second, 1 failing at t=9 only.
    points: list[RatioPoint] = [(float(t), 10.0 if t < 5 else (1.0 if t == 9 else 0.0), 10.0)
                                for t in range(1, 13)]
    assert aggregate_ratio(points, "avg", 3, 10) == (pytest.approx(1 / 30), pytest.approx(30))


def test_a_ratio_rule_is_a_ratio_of_sums_not_a_mean_of_ratios() -> None:
    # A busy minute without errors, but one quiet second with its only request failing: the
    # mean of per-second ratios is 1/60, over a 1% threshold; the ratio of sums is 1/591.
    points: list[RatioPoint] = [(float(t), 0.0, 10.0) for t in range(1, 60)] + [(60.0, 1.0, 1.0)]
    rule = spec(threshold=0.01)
    assert replay(rule, points, "avg", 60, 60, 60, EVERY_S, ratio=True) == []
    ratio, _ = aggregate_ratio(points, "avg", 60, 60)
    assert ratio == pytest.approx(1 / 591)


# --- compare and the rule's names -------------------------------------------------------------

@pytest.mark.parametrize(("comparison", "below", "equal", "above"), [
    (">", False, False, True),
    (">=", False, True, True),
    ("<", True, False, False),
    ("<=", True, True, False),
    ("==", False, True, False),
    ("!=", True, False, True),
])
def test_compare(comparison: str, below: bool, equal: bool, above: bool) -> None:
    assert (compare(1.0, comparison, 2.0), compare(2.0, comparison, 2.0),
            compare(3.0, comparison, 2.0)) == (below, equal, above)


def test_bad_names_are_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="'=>'"):
        compare(1.0, "=>", 0.0)
    with pytest.raises(ValueError, match="'=>'"):
        spec(comparison="=>")
    with pytest.raises(ValueError, match="'ignore'"):
        spec(nodata="ignore")
    with pytest.raises(ValueError, match="every_s"):
        replay(spec(), [], "avg", 60, 0, 10, 0)


@pytest.mark.parametrize(("choices", "names"), [
    ("Aggregation", set(AGGREGATIONS)),
    ("Comparison", set(COMPARISONS)),
    ("NoDataPolicy", set(NODATA_POLICIES)),
    ("AlertState", {"inactive", "pending", "firing", "nodata"}),
])
def test_the_names_are_the_models_choices(choices: str, names: set[str]) -> None:
    # The module is pure, so it repeats the values of the models' TextChoices: read them from
    # the source rather than importing Django.
    models = (Path(__file__).resolve().parents[2] / "console/alerts/models.py").read_text()
    block = models.split(f"class {choices}(models.TextChoices):")[1].split("class ")[0]
    assert {line.split('"')[1] for line in block.splitlines() if '"' in line} == names


# --- the state machine ------------------------------------------------------------------------

P, F, I, N = "pending", "firing", "inactive", "nodata"  # noqa: E741 - a table's alphabet


@pytest.mark.parametrize(("rule", "values", "states"), [
    # for: pending until it held 10 s (t=0 .. t=10), then firing; resolved when it stops.
    (spec(for_s=10), [1, 1, 1, 1, 0], [P, P, F, F, I]),
    # for 0: firing at once.
    (spec(), [1, 0, 0], [F, I, I]),
    # A pending episode interrupted starts again: fires 10 s after the new start (t=25).
    (spec(for_s=10), [1, 1, 0, 1, 1, 1, 1], [P, P, I, P, P, F, F]),
    # Without keep_firing_for a one-tick dip resolves and fires again: the flapping it prevents.
    (spec(), [1, 0, 1, 0, 1], [F, I, F, I, F]),
    # keep_firing_for 10: a one-tick dip (5 s since last true) stays firing.
    (spec(keep_firing_for_s=10), [1, 0, 1, 0, 1], [F, F, F, F, F]),
    # ... a dip longer than keep_firing_for resolves once 10 s passed since it was last true.
    (spec(keep_firing_for_s=10), [1, 0, 0, 0, 1], [F, F, I, I, F]),
    # keep_firing_for does not hold a pending alert: it never fired.
    (spec(for_s=10, keep_firing_for_s=10), [1, 0], [P, I]),
    # The comparison and threshold decide the condition.
    (spec(comparison="<", threshold=0.5), [1, 0, 0.5], [I, F, I]),
])
def test_pending_firing_and_keep_firing_for(rule: RuleSpec, values: list[float | None],
                                            states: list[str]) -> None:
    assert run(rule, values)[0] == states


def test_transitions_carry_their_time_and_value() -> None:
    _, transitions = run(spec(for_s=10), [0.7, 0.8, 0.9, 0.2])
    assert [(t.from_state, t.to_state, t.at, t.value) for t in transitions] == [
        ("inactive", "pending", 0.0, 0.7), ("pending", "firing", 10.0, 0.9),
        ("firing", "inactive", 15.0, 0.2)]
    assert [t.resolved for t in transitions] == [False, False, True]


def test_the_state_keeps_the_episode_timestamps() -> None:
    rule, state = spec(for_s=10, keep_firing_for_s=10), InstanceState()
    for now, value in [(0, 1), (5, 1), (10, 1), (15, 2), (20, 0)]:
        step(rule, state, value, now)
    assert (state.state, state.active_since, state.fired_at, state.last_true_at, state.value) == (
        "firing", 0, 10, 15, 0)
    step(rule, state, 0, 25)
    # Resolved: the episode's start and firing time stay for the resolved notice.
    assert (state.state, state.active_since, state.fired_at, state.last_true_at) == (
        "inactive", 0, 10, 15)
    step(rule, state, 1, 30)
    # A new episode replaces them; it has not fired yet.
    assert (state.state, state.active_since, state.fired_at, state.last_true_at) == (
        "pending", 30, None, 30)


@pytest.mark.parametrize(("rule", "values", "states", "expected"), [
    # nodata: a state of its own, out of firing at once (not a resolution); back to inactive
    # with data (a resolution of the NoData alert).
    (spec(nodata="nodata", keep_firing_for_s=60), [1, None, None, 0], [F, N, N, I],
     [(I, F, 0), (F, N, 5), (N, I, 15)]),
    (spec(nodata="nodata", for_s=10), [1, None, 1, 1, 1], [P, N, P, P, F],
     [(I, P, 0), (P, N, 5), (N, P, 10), (P, F, 20)]),
    (spec(nodata="nodata"), [None, 1], [N, F], [(I, N, 0), (N, F, 5)]),
    # alerting: missing data counts as the condition holding, through for.
    (spec(nodata="alerting"), [0, None, None], [I, F, F], [(I, F, 5)]),
    (spec(nodata="alerting", for_s=10), [None, None, None, 0], [P, P, F, I],
     [(I, P, 0), (P, F, 10), (F, I, 15)]),
    # ok: missing data counts as the condition not holding, with keep_firing_for.
    (spec(nodata="ok"), [1, None], [F, I], [(I, F, 0), (F, I, 5)]),
    (spec(nodata="ok", keep_firing_for_s=10), [1, None, None], [F, F, I], [(I, F, 0), (F, I, 10)]),
    (spec(nodata="ok", for_s=10), [1, None, 1], [P, I, P], [(I, P, 0), (P, I, 5), (I, P, 10)]),
    # keep_last: nothing changes, and the time without data counts towards for.
    (spec(nodata="keep_last"), [1, None, None, 1], [F, F, F, F], [(I, F, 0)]),
    (spec(nodata="keep_last"), [None, None], [I, I], []),
    (spec(nodata="keep_last", for_s=10), [1, None, None, 1], [P, P, P, F], [(I, P, 0), (P, F, 15)]),
])
def test_nodata_policies(rule: RuleSpec, values: list[float | None], states: list[str],
                         expected: list[tuple[str, str, float]]) -> None:
    got_states, transitions = run(rule, values)
    assert got_states == states
    assert moves(transitions) == expected


def test_nodata_values_are_recorded_as_none_except_under_keep_last() -> None:
    for policy, value in [("nodata", None), ("alerting", None), ("ok", None), ("keep_last", 0.9)]:
        state = InstanceState()
        step(spec(nodata=policy), state, 0.9, 0)
        step(spec(nodata=policy), state, None, 5)
        assert state.value == value, policy


@pytest.mark.parametrize(("from_state", "to_state", "resolved"), [
    (F, I, True),
    (N, I, True),
    (N, P, True),
    (F, N, False),
    (N, F, False),
    (P, I, False),
    (P, F, False),
    (I, P, False),
    (I, F, False),
    (I, N, False),
    (P, N, False),
])
def test_resolved(from_state: str, to_state: str, resolved: bool) -> None:
    assert Transition(from_state, to_state, 0.0, None).resolved is resolved


def test_every_notified_episode_resolves_exactly_once() -> None:
    """Over random series under every policy: an alert goes up (into firing or nodata from a quiet
    state) and is resolved in turn, never twice and never without having gone up."""
    rng = random.Random(14)
    for policy in ("nodata", "alerting", "ok", "keep_last"):
        for for_s, keep in [(0, 0), (10, 0), (0, 10), (10, 15)]:
            rule = spec(nodata=policy, for_s=for_s, keep_firing_for_s=keep)
            values = [rng.choice([None, 0.0, 1.0, 1.0]) for _ in range(400)]
            states, transitions = run(rule, values)
            up, ups = False, 0
            previous = "inactive"
            for change in transitions:
                assert change.from_state == previous
                previous = change.to_state
                if change.from_state not in ALERTING_STATES and change.to_state in ALERTING_STATES:
                    assert not up
                    up, ups = True, ups + 1
                if change.resolved:
                    assert up
                    up = False
            assert up == (states[-1] in ALERTING_STATES)
            assert ups > 3, (policy, for_s, keep)


def test_min_count_holds_the_state_at_low_traffic() -> None:
    rule = spec(threshold=0.05, min_count=20)
    one_request: list[RatioPoint] = [(100.0, 1.0, 1.0)]  # one request, failing: 100% errors
    fifty: list[RatioPoint] = [(100.0, 50.0, 50.0)]
    assert aggregate_ratio(one_request, "avg", 60, 100) == (1.0, 1.0)
    assert replay(rule, one_request, "avg", 60, 100, 100, EVERY_S, ratio=True) == []
    assert moves(replay(rule, fifty, "avg", 60, 100, 100, EVERY_S, ratio=True)) == [(I, F, 100)]
    # Without the minimum, the one request fires.
    assert moves(replay(spec(threshold=0.05), one_request, "avg", 60, 100, 100, EVERY_S,
                        ratio=True)) == [(I, F, 100)]


def test_min_count_changes_nothing_not_even_a_firing_alert() -> None:
    rule = spec(threshold=0.05, min_count=20)
    states, transitions = run(rule, [1.0, 0.0, None, 0.0, 0.0], counts=[50, 3, 0, 10, 30])
    # Fires on 50 requests; 3, 0 and 10 requests say nothing; 30 requests without errors resolve.
    assert states == [F, F, F, F, I]
    assert moves(transitions) == [(I, F, 0), (F, I, 20)]
    state = InstanceState(state="pending", active_since=0.0, last_true_at=0.0, value=1.0)
    before = InstanceState(state="pending", active_since=0.0, last_true_at=0.0, value=1.0)
    assert step(rule, state, 0.0, 5.0, count=1.0) == (before, None)
    # No count (a non-ratio series) is always evaluated.
    assert step(rule, state, 0.0, 5.0)[0].state == "inactive"


def test_rate_with_a_counter_reset_fires() -> None:
    # A counter going up 10 a second restarts at t=30 (a worker restart) and counts 10 in its
    # first second: its rate stays 10/s, where last minus first would be negative.
    points: list[Point] = [(float(t), 10.0 * (t if t < 30 else t - 29)) for t in range(0, 61)]
    rule = spec(threshold=5)
    assert moves(replay(rule, points, "rate", 20, 20, 60, EVERY_S)) == [(I, F, 20)]
    assert aggregate(points, "rate", 20, 40) == pytest.approx(10.0)


def test_absent_fires_when_the_series_stops_and_resolves_when_it_returns() -> None:
    points: list[Point] = [(float(t), 1.0) for t in range(0, 31)] + [(float(t), 1.0) for t in range(52, 70)]
    rule = spec(comparison="==", threshold=1)
    assert moves(replay(rule, points, "absent", 10, 10, 60, EVERY_S)) == [(I, F, 40), (F, I, 55)]
    # On a ratio series, absent ignores min_count: its empty window has no requests by definition.
    ratio_points: list[RatioPoint] = [(t, 0.0, 100.0) for t, _ in points]
    assert moves(replay(spec(comparison="==", threshold=1, min_count=20), ratio_points, "absent",
                        10, 10, 60, EVERY_S, ratio=True)) == [(I, F, 40), (F, I, 55)]


def test_replay_evaluates_every_tick_from_start_to_end() -> None:
    # kv_usage: above 0.9 from t=100 to t=160, a one-second dip at t=130 that the 5 s ticks at
    # t=130 catch ("last"), then low.
    points: list[Point] = [(float(t), 0.95 if 100 <= t <= 160 and t != 130 else 0.5)
                           for t in range(0, 301)]
    rule = spec(threshold=0.9, for_s=20, keep_firing_for_s=10)
    transitions = replay(rule, points, "last", 10, 0, 300, EVERY_S)
    assert [(t.from_state, t.to_state, t.at, t.value) for t in transitions] == [
        ("inactive", "pending", 100, 0.95), ("pending", "firing", 120, 0.95),
        ("firing", "inactive", 170, 0.5)]
    # start and end are both ticks; a start after the end evaluates nothing.
    assert moves(replay(rule, points, "last", 10, 100, 120, EVERY_S)) == [(I, P, 100), (P, F, 120)]
    assert replay(rule, points, "last", 10, 300, 0, EVERY_S) == []
    # An avg over the window smooths the dip out (9 points in 10 at 0.95 still average 0.905)
    # and fires once the window is full of high points.
    assert moves(replay(spec(threshold=0.9), points, "avg", 10, 0, 300, EVERY_S)) == [
        (I, F, 110), (F, I, 165)]
    # No data at the start (before the first point): NoData, then the data.
    assert moves(replay(spec(threshold=0.9), points[50:], "last", 10, 0, 60, EVERY_S)) == [
        (I, N, 0), (N, I, 50)]


def test_an_inconsistent_state_is_an_error() -> None:
    with pytest.raises(ValueError, match="active_since"):
        step(spec(for_s=10), InstanceState(state="pending"), 1.0, 5.0)
    with pytest.raises(ValueError, match="last_true_at"):
        step(spec(keep_firing_for_s=10), InstanceState(state="firing"), 0.0, 5.0)
