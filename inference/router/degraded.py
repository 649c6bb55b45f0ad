"""Degraded mode: a PD request served without the role that cannot take it. Decode computes the
prompt itself (a KV consumer answers a request nothing was prefilled for), or prefill runs the
request whole. Slower, but the client gets its answer rather than a 503.

The one place that decides it, for every moment a role goes missing: before the request is
placed (no ready worker), when its prefill fails, when its decode fails before the first byte,
and when a stream's decode breaks off mid-way (migration.py); and for /health.
"""

from __future__ import annotations

from collections.abc import Mapping

from inference.router.backends import Pool
from inference.router.metrics import RouterMetrics

# The role that serves in place of a missing one.
INSTEAD = {"decode": "prefill", "prefill": "decode"}


class DegradedMode:
    def __init__(self, enabled: bool, metrics: RouterMetrics, revision: str):
        self.enabled = enabled
        self.metrics = metrics
        self.revision = revision

    def instead_of(self, pools: Mapping[str, Pool], missing: str, *,
                   timed_out: bool = False) -> str | None:
        """The role that serves a request ``missing`` cannot (it has no ready worker, or its
        call failed), or None: degraded mode is off, the group is not PD, the request's time
        ran out (a second try must not take as long again), or the other role has no ready
        worker either."""
        other = INSTEAD.get(missing)
        if not self.enabled or timed_out or other is None or other not in pools:
            return None
        # ready(), not pick(): pick() would advance the round robin and skew the real pick.
        return other if pools[other].ready() else None

    def counted(self, missing: str) -> None:
        """One request served without ``missing``."""
        self.metrics.degraded.labels(missing, self.revision).inc()

    def missing_role(self, mode: str, missing: list[str]) -> str | None:
        """For /health: the one role a PD group is missing while degraded mode covers it."""
        if self.enabled and mode == "pd" and len(missing) == 1:
            return missing[0]
        return None
