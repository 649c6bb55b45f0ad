"""The autoscaler's decision for one pool, from its signal's recent values. Pure: the tests
replay recorded series through it, and the runner (console/autoscaling/runner.py) only adds the
database's answers (capacity, rollouts) and acts.

The count a signal asks for is proportional, as Kubernetes' HPA computes it: with ``n``
instances at ``v`` per instance, ``ceil(n * v / scale_up_at)`` instances bring each back to the
scale-up level. Above ``scale_up_at`` that grows the pool; below ``scale_down_at`` it may shrink
it, never so far that the remaining instances would sit above ``scale_up_at`` (which would
only grow it again); in between the pool stays as it is.

Stabilization, as HPA's behaviour windows: the pool grows to the *least* count asked for over
the up window (the load must have stayed high the whole window) and shrinks to the *largest*
count asked for over the down window (one quiet moment does not remove an instance). A window
not yet covered by history holds the change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

Action = Literal["up", "down", "none"]

# Why a decision changed the pool, or why it did not although the signal asked for a change.
STEADY = "steady"             # within the thresholds, or asking for less at the minimum
CHANGED = "scaled"            # the signal asked for it over its window
SCHEDULE = "schedule"         # below the minimum (a scheduled window raised it): grown to it
ABOVE_MAX = "above_max"       # above the maximum (the policy lowered it): shrunk to it
RATIO = "ratio"               # moved to keep the P:D ratio band
NO_DATA = "no_data"           # the signal has no value (no scrape, no measured speed)
STABILIZING = "stabilizing"   # the window does not ask for it throughout yet
COOLDOWN = "cooldown"         # the pool changed less than the cooldown ago
STARTING = "starting"         # instances added earlier are not ready yet
AT_MAX = "max"                # the signal asks for more than the maximum
ROLLOUT = "rollout"           # a rollout is moving this deployment's traffic
CAPACITY = "capacity"         # the node has no room for another instance
PREFLIGHT = "preflight"       # the grown plan fails a pre-flight check
DRY_RUN = "dry_run"           # would have changed the pool; the policy only records

REASONS = (STEADY, CHANGED, SCHEDULE, ABOVE_MAX, RATIO, NO_DATA, STABILIZING, COOLDOWN, STARTING, AT_MAX,
           ROLLOUT, CAPACITY, PREFLIGHT, DRY_RUN)


@dataclass(frozen=True)
class Policy:
    min_instances: int
    max_instances: int
    scale_up_at: float
    scale_down_at: float
    up_window_s: float
    down_window_s: float
    max_step: int
    cooldown_s: float


@dataclass(frozen=True)
class Pool:
    current: int                  # instances in the plan now
    starting: int = 0             # of those, not ready yet
    floor: int = 0                # a scheduled window's minimum (0: none open)
    last_change_at: float | None = None
    rollout: str = ""             # an active rollout, in words; "" when none


@dataclass(frozen=True)
class Decision:
    current: int
    asked: int | None      # what the signal asks for at this instant (None: no data)
    desired: int           # after stabilization and the bounds
    target: int            # what the pool is set to (== current when nothing is done)
    action: Action
    reason: str
    detail: str

    @property
    def would_change(self) -> bool:
        """Whether the decision changes the pool or was held back from changing it: the ones
        recorded."""
        return self.reason != STEADY


def asked_for(current: int, value: float | None, policy: Policy,
              ready: int | None = None) -> int | None:
    """The count the signal asks for at one instant; ``value`` is per ready instance (the
    ones the load was divided by: ``ready``, all ``current`` when not given). Instances still
    starting count toward the answer, not toward the load."""
    if value is None:
        return None
    bearing = current if ready is None else ready
    if bearing <= 0:
        return max(current, 1) if value > 0 else current
    proportional = math.ceil(round(bearing * value / policy.scale_up_at, 9))
    if value > policy.scale_up_at:
        return max(current, bearing + 1, proportional)
    if value < policy.scale_down_at:
        return min(current, proportional)
    return current


def stabilized(current: int, history: Sequence[tuple[float, int]], now: float,
               policy: Policy, resolution_s: float) -> tuple[int, bool]:
    """The count the window allows, and whether the window was covered.

    ``history``: (time, asked) of earlier evaluations and this one, oldest first. A window is
    covered once the history reaches back to its start, within one evaluation interval."""
    if not history:
        return current, False
    asked = history[-1][1]
    if asked > current:
        window = policy.up_window_s
        values = [a for t, a in history if t >= now - window]
        covered = history[0][0] <= now - window + resolution_s
        return (max(current, min(values)) if covered else current), covered
    if asked < current:
        window = policy.down_window_s
        values = [a for t, a in history if t >= now - window]
        covered = history[0][0] <= now - window + resolution_s
        return (min(current, max(values)) if covered else current), covered
    return current, True


def decide(policy: Policy, pool: Pool, history: Sequence[tuple[float, int | None]], now: float,
           resolution_s: float = 5.0) -> Decision:
    """The decision for one pool. ``history`` holds (time, asked) of this evaluation and the
    earlier ones, oldest first; an evaluation without data is (time, None)."""
    current = pool.current
    floor = max(policy.min_instances, pool.floor)
    asked = history[-1][1] if history else None

    def hold(reason: str, desired: int, detail: str) -> Decision:
        return Decision(current, asked, desired, current, "none", reason, detail)

    # The bounds come first: a schedule's minimum is a promise, not a load to wait out.
    if current < floor:
        bound, reason = floor, SCHEDULE
    elif current > policy.max_instances:
        bound, reason = policy.max_instances, ABOVE_MAX
    else:
        bound = None
    if bound is not None:
        if pool.rollout:
            return hold(ROLLOUT, bound, f"waiting for the rollout: {pool.rollout}")
        step = max(-policy.max_step, min(policy.max_step, bound - current))
        why = (f"below the minimum {floor}" if reason == SCHEDULE
               else f"above the maximum {policy.max_instances}")
        return Decision(current, asked, bound, current + step, "up" if step > 0 else "down",
                        reason, f"{current} instance(s) is {why}")

    if asked is None:
        return hold(NO_DATA, current, "the signal has no value now")
    known = [(t, a) for t, a in history if a is not None]
    # Without data for a while, the window restarts: a gap is not a quiet period.
    window, covered = stabilized(current, _contiguous(known, history), now, policy, resolution_s)
    desired = max(floor, min(policy.max_instances, window))
    if asked > current and current >= policy.max_instances:
        return hold(AT_MAX, current, f"the signal asks for {asked}; the maximum is "
                    f"{policy.max_instances}")
    if desired == current:
        if asked == current:
            return hold(STEADY, current, "within the thresholds")
        if asked < current <= floor:
            return hold(STEADY, current, f"at the minimum {floor}")
        side = "up" if asked > current else "down"
        seconds = policy.up_window_s if asked > current else policy.down_window_s
        why = "is not covered yet" if not covered else "does not ask for it throughout"
        return hold(STABILIZING, current, f"asks for {asked}; the {side} window ({seconds:g} s) "
                    f"{why}")
    if pool.rollout:
        return hold(ROLLOUT, desired, f"waiting for the rollout: {pool.rollout}")
    if desired > current and pool.starting:
        return hold(STARTING, desired, f"{pool.starting} instance(s) added earlier not ready yet")
    if pool.last_change_at is not None and now - pool.last_change_at < policy.cooldown_s:
        left = policy.cooldown_s - (now - pool.last_change_at)
        return hold(COOLDOWN, desired, f"the pool changed {now - pool.last_change_at:.0f} s ago; "
                    f"{left:.0f} s of the {policy.cooldown_s:g} s cooldown left")
    step = max(-policy.max_step, min(policy.max_step, desired - current))
    detail = f"asks for {desired} over the window"
    if abs(desired - current) > policy.max_step:
        detail += f"; at most {policy.max_step} per decision"
    return Decision(current, asked, desired, current + step, "up" if step > 0 else "down",
                    CHANGED, detail)


def _contiguous(known: list[tuple[float, int]], history: Sequence[tuple[float, int | None]]
                ) -> list[tuple[float, int]]:
    """The known points after the last evaluation without data."""
    gaps = [t for t, a in history if a is None]
    if not gaps:
        return known
    last_gap = gaps[-1]
    return [(t, a) for t, a in known if t > last_gap]


def ratio_band(prefill: Decision, decode: Decision, min_ratio: float, max_ratio: float,
               prefill_max: int, decode_max: int) -> tuple[Decision, Decision]:
    """Both decisions with their targets moved, if need be, so that prefill per decode stays
    within [min_ratio, max_ratio]: the smaller side grows to the band (within its maximum); a
    pool held back (rollout, starting) is not moved."""
    p, d = prefill.target, decode.target
    if d <= 0 or min_ratio <= p / d <= max_ratio:
        return prefill, decode
    movable = {"prefill": prefill.reason not in (ROLLOUT, STARTING),
               "decode": decode.reason not in (ROLLOUT, STARTING)}
    if p / d > max_ratio and movable["decode"]:
        wanted = min(decode_max, math.ceil(round(p / max_ratio, 9)))
        if wanted > d:
            decode = _moved(decode, wanted, f"{p} prefill need at least {wanted} decode "
                            f"(ratio at most {max_ratio:g})")
    elif p / d < min_ratio and movable["prefill"]:
        wanted = min(prefill_max, math.ceil(round(d * min_ratio, 9)))
        if wanted > p:
            prefill = _moved(prefill, wanted, f"{d} decode need at least {wanted} prefill "
                             f"(ratio at least {min_ratio:g})")
    return prefill, decode


def _moved(decision: Decision, target: int, detail: str) -> Decision:
    action: Action = ("up" if target > decision.current else
                      "down" if target < decision.current else "none")
    return replace(decision, target=target, desired=max(decision.desired, target), action=action,
                   reason=RATIO, detail=detail)
