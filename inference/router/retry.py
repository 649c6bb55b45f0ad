"""Where a failed worker call goes next, one rule for every call the router makes (a prefill, a
decode or colocated call, a stream's continuation): another ready worker of the role not tried
yet; else, for a call that never reached its worker, that worker once more if it is still up,
since a connect timeout on a saturated host does not take a worker out (its probe decides)."""

from __future__ import annotations

from inference.router.backends import Backend, NoBackendAvailable, Pool
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest
from inference.router.upstream import BackendFailure


def untried_worker(pool: Pool, parsed: ParsedRequest, tried: list[Backend],
                   metrics: RouterMetrics) -> Backend | None:
    """A ready worker of ``pool`` that ``tried`` does not hold, picked by the pool's policy."""
    try:
        choice = pool.pick(parsed.prompt_token_ids if pool.policy.uses_prompt else (),
                           only=lambda b: b not in tried)
    except NoBackendAvailable:
        return None
    metrics.decision(pool.role, pool.policy.name, choice.outcome)
    return choice.backend


def retry_target(pool: Pool, parsed: ParsedRequest, failure: BackendFailure,
                 tried: list[Backend], metrics: RouterMetrics) -> Backend | None:
    """Where the call that ended in ``failure`` goes once more, or None: nowhere in its role."""
    backend = untried_worker(pool, parsed, tried, metrics)
    if backend is not None:
        return backend
    failed = failure.backend
    if failure.unsent and failed.healthy and not failed.draining and tried.count(failed) == 1:
        return failed
    return None
