"""What operators do to rollouts (the page, REST and ``manage.py rollout`` all come here):
start one, pause, resume, promote, roll back. The supervisor's runner does the rest
(console/control/rollout_runner.py)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from console.deployments.engine_args import check_engine_args, load_parser
from console.deployments.models import Deployment
from console.deployments.placement import Ledger
from console.rollouts import capacity, green_progress, revisions
from console.rollouts.machine import TransitionRefused, move
from console.rollouts.models import Revision, Rollout

Strategy = Rollout.Strategy
State = Rollout.State

DEFAULT_CANARY_STEPS: list[dict[str, Any]] = [
    {"weight": 10, "hold_s": 60}, {"weight": 50, "hold_s": 60}, {"weight": 100, "hold_s": 0}]
# How long a window may grow without both sides reaching min_requests before the rollout
# pauses ("inconclusive: not enough traffic"). 600 s: at 0.5 req/s a 10% canary's green gets
# its 20 requests in ~400 s, so that rate still gets decisions; Argo's progress deadline is
# the same 10 minutes.
DEFAULT_MAX_INCONCLUSIVE_S = 600
# Error and hand-off failure rates absolute, latencies relative to blue over the same window.
# A window lasts interval_s, longer while a side has fewer than min_requests (it grows up to
# max_inconclusive_s).
DEFAULT_ANALYSIS: dict[str, Any] = {
    "interval_s": 10, "failure_limit": 1, "min_requests": 20,
    "max_inconclusive_s": DEFAULT_MAX_INCONCLUSIVE_S,
    "metrics": {
        "error_rate": {"max": 0.01},
        "handoff_failure_rate": {"max": 0.01},
        "ttft_p95": {"max_ratio": 1.5},
        "itl_p95": {"max_ratio": 1.5},
        "tpot_p95": {"max_ratio": 1.5},
    },
}
METRICS = tuple(DEFAULT_ANALYSIS["metrics"])
LIMIT_KEYS = ("max", "max_ratio")


class RolloutRefused(Exception):
    """A rollout that cannot start now; the message says why and ``field`` names the input."""

    def __init__(self, message: str, field: str = "non_field_errors") -> None:
        super().__init__(message)
        self.field = field


def active(deployment: Deployment) -> Rollout | None:
    return deployment.rollouts.filter(state__in=Rollout.ACTIVE_STATES).first()


def validate_steps(steps: Any) -> list[dict[str, Any]]:
    if not isinstance(steps, list) or not steps:
        raise ValidationError({"steps": 'a list such as [{"weight": 10, "hold_s": 60}, ...]'})
    previous = 0
    for index, step in enumerate(steps):
        if not isinstance(step, dict) or set(step) - {"weight", "hold_s"}:
            raise ValidationError({f"steps.{index}": 'an object {"weight": 1-100, "hold_s": >= 0}'})
        weight, hold = step.get("weight"), step.get("hold_s", 0)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ValidationError({f"steps.{index}.weight": "an integer percentage from 1 to 100"})
        if weight <= previous:
            raise ValidationError({f"steps.{index}.weight": "weights must increase step by step"})
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 <= hold <= 86_400:
            raise ValidationError({f"steps.{index}.hold_s": "seconds from 0 to 86400"})
        previous = weight
    if previous != 100:
        raise ValidationError({"steps": "the last step must send green 100% of the traffic"})
    return [{"weight": s["weight"], "hold_s": s.get("hold_s", 0)} for s in steps]


def validate_analysis(analysis: Any) -> dict[str, Any]:
    if analysis is None:
        return dict(DEFAULT_ANALYSIS)
    if not isinstance(analysis, dict):
        raise ValidationError({"analysis": "an object with interval_s, failure_limit, "
                                           "min_requests and metrics"})
    merged = {**DEFAULT_ANALYSIS, **analysis}
    for name, low, high in (("interval_s", 1, 3600), ("failure_limit", 0, 100),
                            ("min_requests", 1, 1_000_000), ("max_inconclusive_s", 1, 86_400)):
        value = merged[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ValidationError({f"analysis.{name}": f"a number from {low} to {high}"})
    if merged["max_inconclusive_s"] < merged["interval_s"]:
        raise ValidationError({"analysis.max_inconclusive_s": "at least interval_s: a window "
                                                              "lasts that long at least"})
    metrics = merged["metrics"]
    if not isinstance(metrics, dict):
        raise ValidationError({"analysis.metrics": f"an object keyed by {', '.join(METRICS)}"})
    for name, limits in metrics.items():
        if name not in METRICS:
            raise ValidationError({f"analysis.metrics.{name}": f"unknown metric; one of "
                                                               f"{', '.join(METRICS)}"})
        if not isinstance(limits, dict) or not limits or set(limits) - set(LIMIT_KEYS):
            raise ValidationError({f"analysis.metrics.{name}":
                                   'an object with "max" (absolute) and/or "max_ratio" (x blue)'})
        for key, value in limits.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValidationError({f"analysis.metrics.{name}.{key}": "a number >= 0"})
    return merged


START_TIMEOUT_RANGE = (30, 86_400)


def validate_start_timeout(value: Any) -> int | None:
    """A rollout's start_timeout_s as given (None: derived from past starts)."""
    if value is None:
        return None
    low, high = START_TIMEOUT_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError({"start_timeout_s": f"whole seconds from {low} to {high}: how long "
                                                  "a green worker may make no progress"})
    return value


def green_ports(deployment: Deployment, spec: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Free ports for green's workers: clear of every plan on their nodes (blue's included) and
    of what is bound on this node now."""
    ports: dict[str, dict[str, int]] = {}
    ledgers: dict[int, Ledger] = {}
    for worker in revisions.shadow_workers(deployment, spec):
        if worker.node.pk not in ledgers:
            ledgers[worker.node.pk] = Ledger.for_node(worker.node, exclude=None)
            ledgers[worker.node.pk].ports.add(deployment.router_port)
        ledger = ledgers[worker.node.pk]
        ports[worker.slot] = {"port": ledger.port(worker.role),
                              "side_channel_port": ledger.side_channel_port()}
    return ports


def pairs(deployment: Deployment) -> list[list[str]]:
    """The plan's units of an in-place rollout: prefill-k with decode-k (or one colocated
    worker), in index order."""
    slots: dict[int, list[str]] = {}
    for worker in deployment.workers.order_by("index", "role"):
        slots.setdefault(worker.index, []).append(worker.slot)
    return [slots[index] for index in sorted(slots)]


def in_place_steps(deployment: Deployment, revision: Revision, steps: Any) -> list[dict[str, Any]]:
    """One step a pair: after k of n pairs run green, green takes k/n of the traffic, its share
    of the capacity. ``steps`` may only set each step's hold."""
    if revision.spec["mode"] != deployment.mode:
        raise RolloutRefused("in place, green's workers take blue's slots one pair at a time: "
                             "a topology switch needs blue_green or canary", "strategy")
    units = pairs(deployment)
    roles = {tuple(sorted(slot.split("-")[0] for slot in unit)) for unit in units}
    if len(units) < 2 or len(roles) != 1:
        raise RolloutRefused(
            f"in place needs at least two whole pairs (prefill-k with decode-k), so that one "
            f"serves while the other restarts; {deployment.name} has "
            f"{', '.join('+'.join(unit) for unit in units)}: add a pair first (instance counts "
            "are live edits), or stop, edit and start", "strategy")
    holds = [60] * len(units)
    if steps is not None:
        if not isinstance(steps, list) or len(steps) != len(units):
            raise ValidationError({"steps": f"in place has one step per pair ({len(units)}); "
                                             "only their hold_s may be set"})
        holds = [step.get("hold_s", 60) if isinstance(step, dict) else step for step in steps]
    return [{"weight": round(100 * (k + 1) / len(units)), "hold_s": hold}
            for k, hold in enumerate(holds)]


def blue_ports(deployment: Deployment) -> dict[str, dict[str, int]]:
    """In place, green's workers take blue's ports as blue's pairs stop."""
    return {w.slot: {"port": w.port, "side_channel_port": w.side_channel_port}
            for w in deployment.workers.all()}


def start(deployment: Deployment, revision: Revision, strategy: str,
          user: AbstractBaseUser | None, *, steps: Any = None, analysis: Any = None,
          scale_down_delay_s: int = 30, drain_timeout_s: int = 120,
          start_timeout_s: int | None = None, verify_green: bool = False) -> Rollout:
    """Start rolling ``revision`` out: green starts beside blue on the next supervisor tick.
    ``start_timeout_s``: how long a green worker may make no progress before the rollout rolls
    back; None derives it from the deployment's past starts (green_progress.default_deadline).
    ``verify_green``: blue is drained only after a verification report of green alone passed."""
    if strategy not in Strategy.values:
        raise RolloutRefused(f"unknown strategy {strategy!r}; one of {', '.join(Strategy.values)}",
                             "strategy")
    if verify_green and strategy == Strategy.IN_PLACE:
        raise RolloutRefused("in place, green never serves alone beside a warm blue to fall "
                             "back to: verify_green needs blue_green or canary", "verify_green")
    if revision.deployment_id != deployment.pk:
        raise RolloutRefused(f"revision r{revision.number} belongs to another deployment",
                             "revision")
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        raise RolloutRefused(f"{deployment.name} is not running: a stopped deployment's plan is "
                             "edited in place and its next start runs it")
    if strategy == Strategy.BLUE_GREEN:
        steps = [{"weight": 100, "hold_s": 0}] if steps is None else steps
    if strategy == Strategy.IN_PLACE:
        steps = in_place_steps(deployment, revision, steps)
    steps = validate_steps(DEFAULT_CANARY_STEPS if steps is None else steps)
    checked = validate_analysis(analysis)
    deadline = validate_start_timeout(start_timeout_s)
    why = "as asked"
    if deadline is None:
        deadline, why = green_progress.default_deadline(deployment.pk)
    # The checks only read, and are made before the write transaction: SQLite's transactions
    # here are IMMEDIATE, holding the write lock for the whole block, and the first check of
    # engine flags in a process imports vLLM (tens of seconds under load). Inside it, a
    # rollout started under `vllm bench serve` held the lock past the 20 s busy timeout and the
    # supervisor's tick failed with "database is locked".
    load_parser(revision.spec.get("extra_engine_args"))
    blue = revisions.ensure_live(deployment)
    if revision.pk == blue.pk:
        raise RolloutRefused(f"r{revision.number} is the live revision already", "revision")
    # The rollout writes the revision's flags into the plan: each that differs from blue's
    # needs its role of the one rolling out or of the draft's author (a superuser's draft
    # may be rolled out by an operator; an operator's draft cannot gain flags through a live
    # revision that changed since). No author: the plan as once started, or a command's.
    check_engine_args(revision.spec.get("extra_engine_args") or [], user,
                      deployment.team_id, before=blue.spec.get("extra_engine_args") or [],
                      author=revision.created_by, authored=True)
    report = revisions.check_spec(deployment, revision.spec)
    if not report.ok:
        errors = "; ".join(f"{o.id}: {o.message}" for o in report.errors)
        raise RolloutRefused(f"green's pre-flight checks failed: {errors}", "revision")
    in_place = strategy == Strategy.IN_PLACE
    if not in_place:
        fits, arithmetic = capacity.second_copy_fits(deployment, revision.spec)
        if not fits:
            raise RolloutRefused(
                f"a second copy does not fit beside the live one ({arithmetic}): use the "
                "in_place strategy, which replaces one prefill+decode pair at a time",
                "strategy")
    with transaction.atomic():
        Deployment.objects.select_for_update().get(pk=deployment.pk)
        if (running := active(deployment)) is not None:
            raise RolloutRefused(f"rollout #{running.pk} of {deployment.name} is {running.state}; "
                                 "one rollout at a time")
        if revisions.ensure_live(deployment).pk != blue.pk:
            raise RolloutRefused("the live revision changed while green was checked; start "
                                 "the rollout again", "revision")
        first = State.RELEASING if in_place else State.STARTING
        rollout = Rollout.objects.create(
            deployment=deployment, from_revision=blue, to_revision=revision, strategy=strategy,
            steps=steps, analysis=checked, scale_down_delay_s=0 if in_place else scale_down_delay_s,
            drain_timeout_s=drain_timeout_s, start_timeout_s=deadline,
            weights={blue.label: 100, revision.label: 0},
            green_ports=(blue_ports(deployment) if in_place
                         else green_ports(deployment, revision.spec)),
            state=first, state_since=timezone.now(), created_by=user, verify_green=verify_green)
        move(rollout, first, f"{user.get_username() if user else 'a command'} started "
             f"a {strategy.replace('_', '-')} rollout of r{revision.number} over r{blue.number}; "
             f"a green worker may go {deadline} s without progress ({why})")
    return rollout


def pause(rollout: Rollout) -> Rollout:
    if rollout.state == State.PAUSED:
        raise TransitionRefused("the rollout is paused already")
    if rollout.state not in (State.RELEASING, State.STARTING, State.GATING, State.STEPPING,
                             State.WARM):
        raise TransitionRefused(f"the rollout is {rollout.state}: nothing to pause")
    return move(rollout, State.PAUSED, "paused by an operator: the weights stay as they are",
                paused_from=rollout.state)


def resume(rollout: Rollout) -> Rollout:
    if rollout.state != State.PAUSED:
        raise TransitionRefused(f"the rollout is {rollout.state}, not paused")
    # The hold of the interrupted step starts again: what was measured before the pause is old.
    return move(rollout, rollout.paused_from, "resumed by an operator", paused_from="",
                step_since=timezone.now() if rollout.step_since else None)


def promote(rollout: Rollout) -> Rollout:
    """Skip the remaining steps and analysis: green takes all the traffic now (Argo's
    "promote --full"); blue then stays warm for the delay and is drained (after green's
    verification passed, when the rollout asks for one: a promote does not skip it)."""
    if rollout.state not in (State.STEPPING, State.PAUSED) or (
            rollout.state == State.PAUSED and rollout.paused_from not in (State.STEPPING, State.WARM)):
        raise TransitionRefused(f"the rollout is {rollout.state}: only a rollout whose green "
                                "passed its gate and takes traffic can be promoted")
    if rollout.strategy == Strategy.IN_PLACE:
        raise TransitionRefused("in place, green takes traffic as its pairs replace blue's: "
                                "there is nothing to promote to")
    last = len(rollout.steps) - 1
    return move(rollout, State.STEPPING, "promoted by an operator: green takes all the traffic",
                step_index=last, step_since=None, paused_from="")


def rollback(rollout: Rollout, reason: str = "rolled back by an operator") -> Rollout:
    """Send green's weight to 0 and drain it; blue serves everything."""
    if rollout.state not in (State.RELEASING, State.STARTING, State.GATING, State.STEPPING,
                             State.PAUSED, State.WARM):
        raise TransitionRefused(f"the rollout is {rollout.state}: it cannot be rolled back now"
                                + ("; roll back to the previous revision instead"
                                   if rollout.state == State.SUCCEEDED else ""))
    blue, green = rollout.from_revision.label, rollout.to_revision.label
    if rollout.strategy == Strategy.IN_PLACE:
        # Pair by pair, green's share shrinking as blue's pairs come back (the runner).
        return move(rollout, State.ROLLING_BACK, reason)
    return move(rollout, State.ROLLING_BACK, reason, weights={blue: 100, green: 0})


def rollback_to_previous(deployment: Deployment, user: AbstractBaseUser | None,
                         strategy: str = Strategy.BLUE_GREEN) -> Rollout:
    """One click: roll the revision live before this one out again, through the same machine."""
    current = revisions.live(deployment)
    if current is None:
        raise RolloutRefused(f"{deployment.name} has no live revision yet")
    previous = (deployment.revisions.filter(state=Revision.State.RETIRED, number__lt=current.number)
                .order_by("-number").first())
    if previous is None:
        raise RolloutRefused(f"{deployment.name} has no revision before r{current.number}")
    return start(deployment, previous, strategy, user)
