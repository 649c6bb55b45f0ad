"""An alert rule's arithmetic and state machine, free of Django so that the evaluator, the rule
preview and the bench run the same code, and cheaply: the evaluator steps every rule instance
every 5 s.

Points are ``(t, value)`` or, for a ratio series, ``(t, numerator/s, denominator/s)``, in time
order (the collector writes them so); a window is ``now - window_s < t <= now``.

Aggregations (``aggregate``):

- ``avg``, ``max``, ``min``, ``last`` over the window's values; no point is no data (None).
- ``rate``: the per-second increase of a counter, reset-aware like Prometheus' ``rate()`` (a
  value below the previous one means the counter restarted from zero, so the whole new value is
  increase), over the span between the window's first and last points. Prometheus extrapolates
  to the window's edges instead; for evenly spaced samples the two agree. Fewer than two points
  (or two at one instant) give no data.
- ``absent``: 1.0 while the window holds no point, else 0.0; never no data, which is what makes
  it the rule for a series that disappeared.

Ratio series (``aggregate_ratio``) weigh each point by the time it covers, ``dt``, the gap to
the point before it (the window's first point takes the median gap, or 1 s alone), and also
return the window's request count ``sum(den * dt)``. ``avg`` and ``rate`` are a ratio of sums,
``sum(num * dt) / sum(den * dt)``, so that one failed request in a quiet second does not outweigh
a busy minute; ``max``, ``min`` and ``last`` are over per-point ratios, skipping points without
requests (``den <= 0``). No requests in the window is no data.

States (``step``), as in Prometheus' alerting rules, with Grafana's NoData:

- A count below the rule's ``min_count`` (a ratio rule at low traffic) is not evaluated:
  nothing changes, so an error-ratio alert neither fires nor resolves on a handful of requests.
  The check comes first, so a ratio window without points (count 0) does not make a rule with
  ``min_count > 0`` go NoData; ``replay`` passes no count for ``absent``, which must see an
  empty window, and the evaluator must do the same.
- No data (value None), by the rule's policy: ``nodata`` moves to the state ``nodata`` at once,
  out of pending or firing alike (keep_firing_for does not hold a firing alert through missing
  data: the alert is notified as NoData instead); ``alerting`` and ``ok`` proceed as if the
  condition held, or did not, with value None; ``keep_last`` changes nothing, not even the
  clocks, so the time without data counts towards ``for`` and ``keep_firing_for``.
- Condition true: inactive or nodata -> pending, starting an episode (``active_since = now``),
  or straight to firing when ``for_s`` is 0; pending -> firing once it has held ``for_s``
  (``fired_at = now``); firing stays firing. ``last_true_at = now``.
- Condition false: pending -> inactive; firing stays firing while ``now - last_true_at <
  keep_firing_for_s``, then -> inactive; nodata -> inactive.
- ``active_since`` and ``fired_at`` describe the latest episode and are kept when it ends, so
  that a resolved notice can say when it started; the next episode replaces them.

Resolution: firing and nodata are the *alerting* states, the ones notified (Grafana's NoData is
an alerting state of its own, notified as such); inactive and pending are quiet. A transition
resolves when it leaves an alerting state for a quiet one: firing -> inactive, nodata ->
inactive and nodata -> pending. Firing -> nodata and nodata -> firing are not resolutions: the
alert stays up and changes its reason. So every notified episode ends in exactly one resolution,
including one that went through NoData; pending -> inactive never fired and resolves nothing.

``step`` mutates the ``InstanceState`` it is given and returns that same object, so the
evaluator keeps one per alert and a tick allocates nothing but the rare ``Transition``.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import cast

Point = tuple[float, float]  # (unix seconds, value)
RatioPoint = tuple[float, float, float]  # (unix seconds, numerator per second, denominator per second)

INACTIVE = "inactive"
PENDING = "pending"
FIRING = "firing"
NODATA = "nodata"
ALERTING_STATES = frozenset({FIRING, NODATA})

AGGREGATIONS = ("avg", "max", "min", "last", "rate", "absent")
NODATA_POLICIES = ("nodata", "alerting", "ok", "keep_last")
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne,
}


def _time(point: tuple[float, ...]) -> float:
    return point[0]


def _check_aggregation(aggregation: str) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")


def _window(points: Sequence[tuple[float, ...]], window_s: float, now: float) -> tuple[int, int]:
    """The window's index range: two binary searches rather than a scan of the whole history."""
    lo = bisect_right(points, now - window_s, key=_time)
    return lo, bisect_right(points, now, lo=lo, key=_time)


def aggregate(points: Sequence[Point], aggregation: str, window_s: float, now: float) -> float | None:
    _check_aggregation(aggregation)
    lo, hi = _window(points, window_s, now)
    if aggregation == "absent":
        return 1.0 if lo == hi else 0.0
    if lo == hi:
        return None
    if aggregation == "last":
        return points[hi - 1][1]
    if aggregation == "avg":
        return math.fsum(points[i][1] for i in range(lo, hi)) / (hi - lo)
    if aggregation == "max":
        return max(points[i][1] for i in range(lo, hi))
    if aggregation == "min":
        return min(points[i][1] for i in range(lo, hi))
    span = points[hi - 1][0] - points[lo][0]
    if span <= 0:
        return None
    increase, previous = 0.0, points[lo][1]
    for i in range(lo + 1, hi):
        value = points[i][1]
        increase += value - previous if value >= previous else value
        previous = value
    return increase / span


def aggregate_ratio(points: Sequence[RatioPoint], aggregation: str, window_s: float,
                    now: float) -> tuple[float | None, float]:
    _check_aggregation(aggregation)
    lo, hi = _window(points, window_s, now)
    if lo == hi:
        return (1.0 if aggregation == "absent" else None), 0.0
    gaps = [points[i][0] - points[i - 1][0] for i in range(lo + 1, hi)]
    first_dt = median(gaps) if gaps else 1.0
    _, num, den = points[lo]
    num_events, den_events = num * first_dt, den * first_dt
    for i, dt in enumerate(gaps, lo + 1):
        _, num, den = points[i]
        num_events += num * dt
        den_events += den * dt
    if aggregation == "absent":
        return 0.0, den_events
    if aggregation in ("avg", "rate"):
        return (num_events / den_events if den_events > 0 else None), den_events
    if aggregation == "last":
        for i in range(hi - 1, lo - 1, -1):
            if points[i][2] > 0:
                return points[i][1] / points[i][2], den_events
        return None, den_events
    pick = max if aggregation == "max" else min
    return pick((points[i][1] / points[i][2] for i in range(lo, hi) if points[i][2] > 0),
                default=None), den_events


def compare(value: float, comparison: str, threshold: float) -> bool:
    try:
        test = COMPARISONS[comparison]
    except KeyError:
        raise ValueError(f"unknown comparison {comparison!r}; known: {' '.join(COMPARISONS)}") from None
    return test(value, threshold)


@dataclass(slots=True, frozen=True)
class RuleSpec:
    comparison: str
    threshold: float
    for_s: float
    keep_firing_for_s: float
    min_count: float
    nodata: str

    def __post_init__(self) -> None:
        # Caught here, a bad name fails when the rule is built, not on the first tick that
        # happens to need it (a nodata policy may wait days for missing data).
        if self.comparison not in COMPARISONS:
            raise ValueError(f"unknown comparison {self.comparison!r}; known: {' '.join(COMPARISONS)}")
        if self.nodata not in NODATA_POLICIES:
            raise ValueError(f"unknown nodata policy {self.nodata!r}; known: {', '.join(NODATA_POLICIES)}")


@dataclass(slots=True)
class InstanceState:
    state: str = INACTIVE
    active_since: float | None = None  # when the condition first held in the latest episode
    fired_at: float | None = None  # when the latest episode fired; None while it has not
    last_true_at: float | None = None
    value: float | None = None


@dataclass(slots=True, frozen=True)
class Transition:
    from_state: str
    to_state: str
    at: float
    value: float | None

    @property
    def resolved(self) -> bool:
        """Leaves a notified state (firing, nodata) for a quiet one (inactive, pending)."""
        return self.from_state in ALERTING_STATES and self.to_state not in ALERTING_STATES


def step(spec: RuleSpec, current: InstanceState, value: float | None, now: float,
         count: float | None = None) -> tuple[InstanceState, Transition | None]:
    if count is not None and count < spec.min_count:
        return current, None
    before = current.state
    if value is None:
        if spec.nodata == "keep_last":
            return current, None
        if spec.nodata == "nodata":
            current.value = None
            if before == NODATA:
                return current, None
            current.state = NODATA
            return current, Transition(before, NODATA, now, None)
        holds = spec.nodata == "alerting"
    else:
        holds = compare(value, spec.comparison, spec.threshold)
    current.value = value
    if holds:
        current.last_true_at = now
        if before == INACTIVE or before == NODATA:
            current.active_since = now
            if spec.for_s <= 0:
                current.state, current.fired_at = FIRING, now
            else:
                current.state, current.fired_at = PENDING, None
        elif before == PENDING:
            if current.active_since is None:
                raise ValueError("a pending state needs active_since")
            if now - current.active_since >= spec.for_s:
                current.state, current.fired_at = FIRING, now
    elif before == PENDING or before == NODATA:
        current.state = INACTIVE
    elif before == FIRING:
        if current.last_true_at is None:
            raise ValueError("a firing state needs last_true_at")
        if now - current.last_true_at >= spec.keep_firing_for_s:
            current.state = INACTIVE
    if current.state == before:
        return current, None
    return current, Transition(before, current.state, now, value)


def replay(spec: RuleSpec, points: Sequence[Point] | Sequence[RatioPoint], aggregation: str,
           window_s: float, start: float, end: float, every_s: float,
           ratio: bool = False) -> list[Transition]:
    """The transitions a rule would have made over recorded points, evaluated every ``every_s``
    from ``start`` to ``end`` (both included), from an inactive state."""
    _check_aggregation(aggregation)
    if every_s <= 0:
        raise ValueError(f"every_s must be positive, not {every_s!r}")
    state = InstanceState()
    transitions: list[Transition] = []
    i = 0
    # Multiplying rather than adding keeps the ticks on the grid over a long replay.
    while (now := start + i * every_s) <= end:
        if ratio:
            value, count = aggregate_ratio(cast(Sequence[RatioPoint], points), aggregation,
                                           window_s, now)
            _, change = step(spec, state, value, now, None if aggregation == "absent" else count)
        else:
            value = aggregate(cast(Sequence[Point], points), aggregation, window_s, now)
            _, change = step(spec, state, value, now)
        if change is not None:
            transitions.append(change)
        i += 1
    return transitions
