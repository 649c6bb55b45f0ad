"""Changing a pool's size through the plan, as an operator's edit would.

Growing adds an instance like the pool's newest one (its node, whether it shares devices) with
every other value proposed by the plan's placement rules (a free port and side-channel port,
the least used core or a free GPU) and runs the pre-flight checks that
a new instance can fail: device and port conflicts, and memory, which is the node's capacity.
A failing check rolls the change back; nothing is half-written. The supervisor then starts the
worker, and the pool sync joins it to the router once it is ready.

Shrinking removes the newest instances from the plan: the supervisor has the router drain them
first (no new requests; streams in flight finish; a prefill worker keeps its KV lease until
decode has pulled it) and stops them after.
"""

from __future__ import annotations

from dataclasses import dataclass

from console.audit.entries import record
from console.checks import devices, memory, ports
from console.checks.base import Severity
from console.checks.plan import PlanView
from console.deployments.models import Deployment
from console.deployments.plans import (
    InstanceInput,
    PlanInput,
    plan_transaction,
    save_plan,
    stored_pools,
)

# The checks a grown pool can fail; the others are about what every instance shares.
GROWTH_CHECKS = (devices.device_conflict, ports.port_conflict, ports.port_bound)


class Refused(Exception):
    """A change the plan cannot take; ``reason`` is the decision's (capacity or preflight)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Resized:
    slots: list[str]   # the slots added or removed
    urls: list[str]


def resize(deployment: Deployment, role: str, target: int) -> Resized:
    """Set ``role``'s pool to ``target`` instances; raises ``Refused`` and changes nothing
    when the grown plan fails a check (raised inside the transaction, it rolls the edit back)."""
    with plan_transaction(PlanInput(), deployment):
        # The caller's copy may be as old as its evaluation; the plan edit saves every
        # field, and a stale copy would undo a stop or an edit made since.
        fresh = Deployment.objects.select_for_update().get(pk=deployment.pk)
        return _resize(fresh, role, target)


def _resize(deployment: Deployment, role: str, target: int) -> Resized:
    pools = stored_pools(deployment)
    pool = pools[role]
    before = {w.slot: w.url for w in deployment.workers.filter(role=role)}
    current = len(pool.instances)
    if target > current:
        # New instances look like the pool's newest one (its node, whether it declares shared
        # devices), as a ReplicaSet's pods follow its template; ports and devices are proposed.
        template = pool.instances[-1]
        pool.instances += [InstanceInput(node=template.node, share_devices=template.share_devices)
                           for _ in range(target - current)]
    else:
        pool.instances = pool.instances[:target]
    save_plan(PlanInput(pools={role: pool}, partial=True), deployment)
    after = {w.slot: w.url for w in deployment.workers.filter(role=role)}
    changed = sorted(set(after) ^ set(before))
    if target > current:
        _check_growth(deployment, changed)
    record("deployment.autoscale", deployment, before={f"{role}_instances": current},
           after={f"{role}_instances": target})
    urls = {**before, **after}
    return Resized(changed, [urls[slot] for slot in changed])


def _check_growth(deployment: Deployment, added: list[str]) -> None:
    plan = PlanView.load(deployment)
    errors = [r for check in GROWTH_CHECKS for r in check(plan).results
              if r.severity == Severity.ERROR]
    if errors:
        raise Refused("preflight", "; ".join(r.message for r in errors))
    fit = memory.memory_fit(plan)
    lacking = [r for r in fit.results if r.severity == Severity.ERROR]
    if lacking:
        raise Refused("capacity", f"adding {', '.join(added)}: "
                      + "; ".join(r.message for r in lacking))
