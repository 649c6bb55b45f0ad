"""The autoscaler's decision over recorded series, fed through ``asked_for`` and ``decide`` as
the runner feeds them (console/autoscaling/runner.py): stabilization windows, cooldown, the
step, the bounds and a schedule's floor, the ratio band, and the holds (rollout, starting, no
data). Then the schedules: validation naming the window and key, windows opening and closing
in their timezone, across DST changes too."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError

from console.autoscaling import decide
from console.autoscaling.schedules import MAX_WINDOWS, scheduled_minimum, validate_schedules

INTERVAL_S = 5.0
POLICY = decide.Policy(min_instances=1, max_instances=4, scale_up_at=4.0, scale_down_at=1.0,
                       up_window_s=30, down_window_s=60, max_step=1, cooldown_s=600)


@dataclass
class Replay:
    """One pool as the runner keeps it in active mode: each evaluation reads the pool's total
    load, divides it by the instances, asks, keeps the history over the longest window, and
    a change sets the pool's count and its last change."""

    policy: decide.Policy
    current: int = 1
    floor: int = 0
    history: deque[tuple[float, int | None]] = field(default_factory=deque)
    last_change_at: float | None = None

    def step(self, at: float, load: float | None) -> decide.Decision:
        value = None if load is None else load / self.current
        self.history.append((at, decide.asked_for(self.current, value, self.policy)))
        keep = max(self.policy.up_window_s, self.policy.down_window_s) + 2 * INTERVAL_S
        while self.history[0][0] < at - keep:
            self.history.popleft()
        decision = decide.decide(
            self.policy, decide.Pool(current=self.current, floor=self.floor,
                                     last_change_at=self.last_change_at),
            list(self.history), at, resolution_s=INTERVAL_S)
        if decision.action != "none":
            self.current, self.last_change_at = decision.target, at
        return decision

    def run(self, series: Sequence[tuple[float, float | None]]
            ) -> list[tuple[float, decide.Decision]]:
        return [(at, self.step(at, load)) for at, load in series]


def ticks(until: float, start: float = 0.0) -> list[float]:
    return [start + i * INTERVAL_S for i in range(int((until - start) / INTERVAL_S) + 1)]


def changes(decisions: list[tuple[float, decide.Decision]]) -> list[tuple[float, decide.Decision]]:
    return [(at, d) for at, d in decisions if d.action != "none"]


def covered_from(first: float, window: float) -> float:
    """The first evaluation whose window the history covers, when it starts at ``first``: the
    earliest evaluation stands for the interval before it."""
    return next(t for t in ticks(first + window + INTERVAL_S, first)
                if first <= t - window + INTERVAL_S)


def held(history: list[tuple[float, int | None]], pool: decide.Pool,
         policy: decide.Policy = POLICY) -> decide.Decision:
    return decide.decide(policy, pool, history, history[-1][0], resolution_s=INTERVAL_S)


def asking(count: int, seconds: float, at: float = 1000.0) -> list[tuple[float, int | None]]:
    """A history asking for ``count`` at every evaluation over the last ``seconds``."""
    return [(t, count) for t in ticks(at, at - seconds)]


# ---- what the signal asks for ---------------------------------------------------------------

@pytest.mark.parametrize("current", [1, 2, 3, 5, 8])
def test_the_count_asked_for_brings_each_instance_back_to_the_scale_up_level(
        current: int) -> None:
    policy, slack = POLICY, 1e-9
    for tenth in range(0, 200):
        value = tenth / 10
        asked = decide.asked_for(current, value, policy)
        assert asked is not None
        total = current * value
        if value > policy.scale_up_at:
            assert asked > current
            # Enough instances that each is at or below the scale-up level, and no more.
            assert asked * policy.scale_up_at >= total - slack
            assert asked == current + 1 or (asked - 1) * policy.scale_up_at < total - slack
        elif value < policy.scale_down_at:
            assert asked <= current
            # Never so few that the rest would sit above the scale-up level.
            assert asked * policy.scale_up_at >= total - slack
            assert asked == 0 or (asked - 1) * policy.scale_up_at < total + slack
        else:
            assert asked == current, f"{value} per instance is within the thresholds"
    assert decide.asked_for(current, None, policy) is None


def test_an_instance_still_starting_bears_no_load_but_counts_toward_the_answer() -> None:
    per_ready = 3 * POLICY.scale_up_at
    # Two planned, one ready carrying it all: the same count as one instance carrying it.
    assert decide.asked_for(2, per_ready, POLICY, ready=1) == decide.asked_for(1, per_ready,
                                                                             POLICY)
    assert decide.asked_for(2, per_ready, POLICY, ready=1) < decide.asked_for(2, per_ready,
                                                                            POLICY)


def test_an_empty_pool_asks_for_one_instance_when_anything_comes() -> None:
    assert decide.asked_for(0, 0.5, POLICY) == 1
    assert decide.asked_for(0, 0.0, POLICY) == 0


# ---- stabilization ----------------------------------------------------------------------------

def test_growth_waits_until_the_up_window_is_covered() -> None:
    load = 2.5 * POLICY.scale_up_at  # one instance at 2.5x the level: asks for 3
    decisions = Replay(POLICY).run([(t, load) for t in ticks(60)])
    grown_at = covered_from(0.0, POLICY.up_window_s)
    [(first, change), *_] = changes(decisions)
    assert first == grown_at
    assert (change.current, change.desired, change.target, change.action, change.reason) == (
        1, 3, 1 + POLICY.max_step, "up", decide.CHANGED)
    for at, decision in decisions:
        if at < grown_at:
            assert (decision.reason, decision.target) == (decide.STABILIZING, 1), at
            assert "is not covered yet" in decision.detail


def test_one_reading_within_the_thresholds_holds_growth_for_a_whole_window() -> None:
    high, in_band, dip = 2.5 * POLICY.scale_up_at, POLICY.scale_up_at / 2, 20.0
    series = [(t, in_band if t == dip else high) for t in ticks(90)]
    decisions = Replay(POLICY).run(series)
    [(first, _change), *_] = changes(decisions)
    # The window must not hold the moment in the band: growth waits until it has left it.
    assert first == next(t for t, _ in series if t - POLICY.up_window_s > dip)
    covered = covered_from(0.0, POLICY.up_window_s)
    for at, decision in decisions:
        if covered <= at < first:
            assert decision.reason == decide.STABILIZING
            assert decision.target == 1
            assert "does not ask for it throughout" in decision.detail


def test_shrinking_goes_to_the_largest_count_asked_over_the_down_window() -> None:
    policy = replace(POLICY, scale_down_at=3.0, max_step=3, cooldown_s=0)
    # Three instances: first a load that asks for two (below the scale-down level), then one
    # that asks for one.
    two, one, last_two = 1.75 * policy.scale_up_at, 0.375 * policy.scale_up_at, 10.0
    assert decide.asked_for(3, two / 3, policy) == 2
    assert decide.asked_for(3, one / 3, policy) == 1
    series = [(t, two if t <= last_two else one) for t in ticks(120)]
    decisions = Replay(policy, current=3).run(series)
    [(first, to_two), (second, to_one)] = changes(decisions)
    # Covered: the window still holds the readings that asked for two.
    assert first == covered_from(0.0, policy.down_window_s)
    assert (to_two.current, to_two.desired, to_two.target, to_two.action) == (3, 2, 2, "down")
    # One only once the last reading that asked for two has left the window.
    assert second == next(t for t, _ in series if t - policy.down_window_s > last_two)
    assert (to_one.current, to_one.target) == (2, 1)
    for at, decision in decisions:
        if first < at < second:
            assert decision.reason == decide.STABILIZING, at


def test_one_quiet_moment_removes_no_instance() -> None:
    in_band, quiet = 2 * (POLICY.scale_up_at + POLICY.scale_down_at) / 2, 0.0
    series = [(t, quiet if t == 100 else in_band) for t in ticks(400)]
    decisions = Replay(POLICY, current=2).run(series)
    assert not changes(decisions)
    assert {d.reason for _, d in decisions} == {decide.STEADY, decide.STABILIZING}
    assert dict(decisions)[100].reason == decide.STABILIZING
    assert not dict(decisions)[95].would_change  # steady decisions are not recorded


# ---- cooldown and step ------------------------------------------------------------------------

def test_the_cooldown_spaces_changes_while_the_load_stays_high() -> None:
    policy = replace(POLICY, up_window_s=10, cooldown_s=60)
    load = policy.max_instances * policy.scale_up_at  # asks for the maximum from one instance
    decisions = Replay(policy).run([(t, load) for t in ticks(400)])
    made = changes(decisions)
    assert [d.target for _, d in made] == list(range(2, policy.max_instances + 1))
    times = [at for at, _ in made]
    # Each change after the first as soon as the cooldown allows.
    for before, after in zip(times, times[1:], strict=False):
        assert after == next(t for t in ticks(400) if t - before >= policy.cooldown_s)
    cooling = [(at, d) for at, d in decisions if times[0] < at < times[1]]
    assert cooling and all(d.reason == decide.COOLDOWN for _, d in cooling)
    assert all(d.desired > d.current == d.target for _, d in cooling)
    _, last = decisions[-1]
    assert (last.current, last.reason) == (policy.max_instances, decide.STEADY)


def test_one_decision_moves_at_most_max_step() -> None:
    policy = replace(POLICY, max_instances=8, max_step=2)
    asked = decide.asked_for(1, 10 * policy.scale_up_at, policy)
    assert asked == 10
    decision = held(asking(asked, policy.up_window_s), decide.Pool(current=1), policy)
    assert (decision.desired, decision.target, decision.action) == (policy.max_instances,
                                                                     1 + policy.max_step, "up")
    assert f"at most {policy.max_step} per decision" in decision.detail


# ---- bounds and schedules ---------------------------------------------------------------------

def test_asking_beyond_the_maximum_holds_at_it() -> None:
    at_max = POLICY.max_instances
    decision = held(asking(at_max + 3, POLICY.up_window_s), decide.Pool(current=at_max))
    assert (decision.reason, decision.action, decision.target) == (decide.AT_MAX, "none", at_max)
    assert decision.would_change
    assert f"asks for {at_max + 3}" in decision.detail


def test_growth_stops_at_the_maximum() -> None:
    load = 10 * POLICY.max_instances * POLICY.scale_up_at
    decisions = Replay(replace(POLICY, cooldown_s=0, up_window_s=0)).run(
        [(t, load) for t in ticks(60)])
    assert max(d.target for _, d in decisions) == POLICY.max_instances
    assert decisions[-1][1].reason == decide.AT_MAX


def test_a_pool_above_a_lowered_maximum_shrinks_at_once() -> None:
    decision = held([(1000.0, None)], decide.Pool(current=POLICY.max_instances + 2,
                                                  last_change_at=1000.0))
    assert (decision.reason, decision.action) == (decide.ABOVE_MAX, "down")
    assert decision.target == POLICY.max_instances + 2 - POLICY.max_step


@pytest.mark.parametrize("max_step", [1, 3])
def test_a_schedules_floor_grows_the_pool_at_once(max_step: int) -> None:
    policy = replace(POLICY, max_step=max_step)
    floor = 3
    # Quiet, just changed and with an instance starting: none of it waits out a promise.
    decision = held(asking(0, 5), decide.Pool(current=1, floor=floor, starting=1,
                                              last_change_at=1000.0), policy)
    assert (decision.reason, decision.action) == (decide.SCHEDULE, "up")
    assert decision.desired == floor
    assert decision.target == min(floor, 1 + max_step)
    assert f"below the minimum {floor}" in decision.detail


def test_a_schedules_floor_raised_during_a_run_grows_the_next_evaluation() -> None:
    replay = Replay(POLICY)
    quiet = [(t, 0.0) for t in ticks(60)]
    assert not changes(replay.run(quiet))
    replay.floor = 2
    decision = replay.step(65.0, 0.0)
    assert (decision.reason, decision.target) == (decide.SCHEDULE, 2)
    # Once there, quiet load keeps it at the floor: nothing to record.
    after = replay.step(70.0, 0.0)
    assert (after.reason, after.target, after.would_change) == (decide.STEADY, 2, False)
    assert "at the minimum 2" in after.detail


def test_a_rollout_holds_even_the_schedules_floor() -> None:
    decision = held(asking(1, 5), decide.Pool(current=1, floor=2, rollout="r2 is stepping"))
    assert (decision.reason, decision.action, decision.target, decision.desired) == (
        decide.ROLLOUT, "none", 1, 2)


# ---- holds ------------------------------------------------------------------------------------

def test_a_rollout_holds_the_change_the_window_asks_for() -> None:
    history = asking(3, POLICY.up_window_s)
    assert held(history, decide.Pool(current=1)).action == "up"
    decision = held(history, decide.Pool(current=1, rollout="r2 is stepping"))
    assert (decision.reason, decision.action, decision.target) == (decide.ROLLOUT, "none", 1)
    assert decision.desired == 3
    assert "r2 is stepping" in decision.detail


def test_instances_still_starting_hold_further_growth_but_not_shrinking() -> None:
    grow = held(asking(3, POLICY.up_window_s), decide.Pool(current=2, starting=1))
    assert (grow.reason, grow.action, grow.target) == (decide.STARTING, "none", 2)
    shrink = held(asking(1, POLICY.down_window_s), decide.Pool(current=3, starting=1))
    assert (shrink.reason, shrink.action, shrink.target) == (decide.CHANGED, "down", 2)


def test_no_data_holds_and_the_window_starts_again_after_it() -> None:
    high, gap = 2.5 * POLICY.scale_up_at, 25.0
    series = [(t, None if t == gap else high) for t in ticks(100)]
    decisions = Replay(POLICY).run(series)
    missing = dict(decisions)[gap]
    assert (missing.reason, missing.asked, missing.action) == (decide.NO_DATA, None, "none")
    assert missing.would_change
    [(first, _change), *_] = changes(decisions)
    # Without the gap growth would come at the first coverage; the gap is not a high period.
    assert first == covered_from(gap + INTERVAL_S, POLICY.up_window_s)
    assert first > covered_from(0.0, POLICY.up_window_s)


# ---- the ratio band ---------------------------------------------------------------------------

def steady(count: int) -> decide.Decision:
    return held([(1000.0, count)], decide.Pool(current=count))


def test_a_pair_within_the_band_is_left_as_it_is() -> None:
    prefill, decode = steady(2), steady(2)
    assert decide.ratio_band(prefill, decode, 0.5, 2.0, 4, 4) == (prefill, decode)


def test_too_much_prefill_grows_decode_to_the_band() -> None:
    prefill, decode = steady(4), steady(1)
    max_ratio = 2.0
    p, d = decide.ratio_band(prefill, decode, 0.5, max_ratio, 8, 8)
    assert p == prefill
    assert (d.reason, d.action, d.current) == (decide.RATIO, "up", 1)
    assert d.target == math.ceil(4 / max_ratio)
    assert 4 / d.target <= max_ratio


def test_too_little_prefill_grows_prefill_to_the_band() -> None:
    min_ratio = 0.5
    p, d = decide.ratio_band(steady(1), steady(4), min_ratio, 2.0, 8, 8)
    assert (p.reason, p.action, p.target) == (decide.RATIO, "up", math.ceil(4 * min_ratio))
    assert d == steady(4)


def test_the_band_grows_a_pool_no_further_than_its_maximum() -> None:
    p, d = decide.ratio_band(steady(4), steady(1), 0.5, 1.0, 8, 2)
    assert (d.target, d.reason) == (2, decide.RATIO)


def test_the_band_keeps_a_shrink_from_leaving_it() -> None:
    shrinking = held(asking(1, POLICY.down_window_s), decide.Pool(current=2))
    assert (shrinking.action, shrinking.target) == ("down", 1)
    _p, d = decide.ratio_band(steady(2), shrinking, 0.5, 1.0, 4, 4)
    assert (d.action, d.target, d.reason) == ("none", 2, decide.RATIO)


@pytest.mark.parametrize("reason", [decide.ROLLOUT, decide.STARTING])
def test_a_pool_held_back_is_not_moved_by_the_band(reason: str) -> None:
    decode = replace(steady(1), reason=reason)
    assert decide.ratio_band(steady(4), decode, 0.5, 1.0, 8, 8)[1] == decode
    prefill = replace(steady(1), reason=reason)
    assert decide.ratio_band(prefill, steady(4), 1.0, 2.0, 8, 8)[0] == prefill


# ---- schedules --------------------------------------------------------------------------------

WEEKDAY_MORNING = {"name": "morning peak", "cron": "0 8 * * 1-5", "duration_s": 7200,
                   "min_instances": 3}


@pytest.mark.parametrize(("window", "message"), [
    ("08:00", "1: expected an object"),
    ({**WEEKDAY_MORNING, "when": "mornings"}, "1: unknown key(s) when"),
    ({**WEEKDAY_MORNING, "cron": "0 25 * * *"}, "1.cron: '0 25 * * *' is not a cron"),
    ({**WEEKDAY_MORNING, "cron": 8}, "1.cron: expected a cron expression"),
    ({k: v for k, v in WEEKDAY_MORNING.items() if k != "cron"}, "1.cron:"),
    ({**WEEKDAY_MORNING, "duration_s": 59}, "1.duration_s: expected whole seconds"),
    ({**WEEKDAY_MORNING, "duration_s": 7 * 86_400 + 1}, "1.duration_s:"),
    ({**WEEKDAY_MORNING, "duration_s": 600.5}, "1.duration_s:"),
    ({**WEEKDAY_MORNING, "min_instances": 0}, "1.min_instances: expected a whole number"),
    ({**WEEKDAY_MORNING, "min_instances": True}, "1.min_instances:"),
    ({**WEEKDAY_MORNING, "name": 3}, "1.name: expected text"),
    ({**WEEKDAY_MORNING, "timezone": "Mars/Olympus"}, "1.timezone: unknown zone 'Mars/Olympus'"),
])
def test_a_bad_window_is_named_by_its_index_and_key(window: object, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_schedules([WEEKDAY_MORNING, window])
    assert caught.value.messages[0].startswith(message), caught.value.messages


def test_schedules_must_be_a_short_list() -> None:
    with pytest.raises(ValidationError, match="expected a list"):
        validate_schedules(WEEKDAY_MORNING)
    with pytest.raises(ValidationError, match=f"at most {MAX_WINDOWS} windows"):
        validate_schedules([WEEKDAY_MORNING] * (MAX_WINDOWS + 1))
    validate_schedules([WEEKDAY_MORNING] * MAX_WINDOWS)
    validate_schedules([{**WEEKDAY_MORNING, "timezone": "Europe/Paris"}])


def test_a_window_is_open_from_its_cron_time_for_its_duration() -> None:
    monday = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
    assert monday.weekday() == 0
    end = monday + timedelta(seconds=WEEKDAY_MORNING["duration_s"])
    name = WEEKDAY_MORNING["name"]
    assert scheduled_minimum([WEEKDAY_MORNING], monday - timedelta(seconds=1)) == (0, "")
    assert scheduled_minimum([WEEKDAY_MORNING], monday) == (3, name)
    assert scheduled_minimum([WEEKDAY_MORNING], end - timedelta(milliseconds=500)) == (3, name)
    assert scheduled_minimum([WEEKDAY_MORNING], end) == (0, "")
    saturday = monday - timedelta(days=2)
    assert scheduled_minimum([WEEKDAY_MORNING], saturday + timedelta(minutes=30)) == (0, "")


def test_the_largest_minimum_of_the_open_windows_counts() -> None:
    monday = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    all_day = {"cron": "0 0 * * *", "duration_s": 86_400, "min_instances": 2}
    closed = {"cron": "0 20 * * *", "duration_s": 3600, "min_instances": 9, "name": "evening"}
    assert scheduled_minimum([all_day, WEEKDAY_MORNING, closed], monday) == (
        3, WEEKDAY_MORNING["name"])
    # A window without a name is named by its place.
    assert scheduled_minimum([closed, all_day], monday) == (2, "window 1")


def test_a_window_reads_its_cron_in_its_timezone() -> None:
    zone = ZoneInfo("America/New_York")
    window = {"cron": "0 8 * * *", "duration_s": 3600, "min_instances": 2,
              "timezone": "America/New_York"}
    for day in (datetime(2026, 1, 14), datetime(2026, 7, 14)):
        opens = day.replace(hour=8, tzinfo=zone).astimezone(UTC)
        assert scheduled_minimum([window], opens + timedelta(minutes=30))[0] == 2, day
        assert scheduled_minimum([window], opens - timedelta(minutes=1))[0] == 0, day
    # The same UTC time of day is inside the window in one season and outside in the other.
    winter = datetime(2026, 1, 14, 8, 0, tzinfo=zone).astimezone(UTC)
    summer_same_utc = winter.replace(month=7)
    assert scheduled_minimum([window], winter + timedelta(minutes=30))[0] == 2
    assert scheduled_minimum([window], summer_same_utc + timedelta(minutes=30))[0] == 0


@pytest.mark.parametrize("opens", [
    datetime(2026, 3, 8, 1, 30, tzinfo=ZoneInfo("America/New_York")),   # clocks go forward
    datetime(2026, 11, 1, 0, 30, tzinfo=ZoneInfo("America/New_York")),  # clocks go back
])
def test_a_window_over_a_dst_change_lasts_its_duration(opens: datetime) -> None:
    window = {"cron": f"{opens.minute} {opens.hour} * * *", "duration_s": 7200,
              "min_instances": 2, "timezone": "America/New_York"}
    start = opens.astimezone(UTC)
    end = start + timedelta(seconds=window["duration_s"])
    assert scheduled_minimum([window], start - timedelta(seconds=1))[0] == 0
    assert scheduled_minimum([window], start)[0] == 2
    assert scheduled_minimum([window], end - timedelta(seconds=1))[0] == 2
    assert scheduled_minimum([window], end)[0] == 0
