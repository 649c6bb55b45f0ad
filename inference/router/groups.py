"""Revision groups: the workers of one revision of a deployment, for blue-green and canary
rollouts.

During a rollout two revisions run side by side, each with its own pools (prefill and decode, or
colocated: a rollout may change the topology). A request picks one group (see selection.py) and
stays inside it for everything that follows: prefill, decode, retries, degraded mode, rendering
on a worker. A prefill of one revision is never paired with a decode of another: their KV caches
and tokenizers need not agree.

Each group has its own placer, prefill stage, forwarder and warm-up, built from the router's
config exactly as a single-pool router builds them; the group's mode overrides the config's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.kv_channels import uses_transfer_params
from inference.router.adaptive import AdaptivePlacer, PrefillQueue
from inference.router.backends import Backend, Breaker, Pool
from inference.router.calls import WorkerCalls
from inference.router.config import RouterConfig
from inference.router.degraded import DegradedMode
from inference.router.forward import Forwarder
from inference.router.handoff import PrefillStage
from inference.router.metrics import RouterMetrics
from inference.router.policies import make_policy
from inference.router.warmup import PairWarmer

ROLES = {"pd": ("prefill", "decode"), "colocated": ("colocated",)}
ACTIVE, DRAINING = "active", "draining"


class LastGroup(Exception):
    """The group asked to be removed is the only active one: removing it would leave nothing
    to serve."""


@dataclass(frozen=True)
class WarmupPrompt:
    """The NIXL warm-up's synthetic prompt, made once by the router's tokenizer."""

    ids: list[int]
    vocab_size: int


@dataclass(eq=False)
class Group:
    revision: str
    mode: str  # "pd" | "colocated"
    pools: dict[str, Pool]
    calls: WorkerCalls
    forwarder: Forwarder
    placer: AdaptivePlacer | None
    prefill_stage: PrefillStage | None
    warmer: PairWarmer | None
    degraded: DegradedMode
    weight: int
    state: str = ACTIVE
    # Requests that picked this group and have not ended. A drain waits for them before it
    # takes the pools away, so that none loses its retry or degraded fallback halfway.
    requests: int = 0
    _idle: asyncio.Event | None = field(default=None, repr=False)
    _warming: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def routable(self) -> bool:
        """Whether new requests may pick it. A weight of 0 means never, not even as a last
        resort: it is how a revision that failed its gate is kept from all clients."""
        return self.state == ACTIVE and self.weight > 0

    def backends(self) -> list[Backend]:
        """Every member, draining ones included."""
        return [b for pool in self.pools.values() for b in [*pool.backends, *pool.draining]]

    @property
    def in_flight(self) -> int:
        return sum(b.in_flight for b in self.backends())

    @property
    def kv_pending(self) -> int:
        return sum(b.kv_pending for b in self.backends())

    # ---- lifecycle -------------------------------------------------------------------
    def open(self, connect_timeout_s: float) -> None:
        for backend in self.backends():
            backend.open(connect_timeout_s)
        if self.warmer is not None:
            self._warming = asyncio.create_task(self.warmer.run_forever())

    async def stop_warmup(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming
            self._warming = None

    def enter(self) -> None:
        self.requests += 1

    def leave(self) -> None:
        self.requests -= 1
        if self.requests == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Until no request that picked this group is left."""
        if self.requests:
            self._idle = asyncio.Event()
            await self._idle.wait()

    # ---- readiness -------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Per-role readiness, and whether the group serves fully ("ok"), without one role
        ("degraded", PD with degraded mode only) or not at all ("unavailable")."""
        roles = {
            role: {
                "ready": len(pool.ready()),
                "total": len(pool.backends),
                "backends": [
                    {"url": b.url, "ready": b.healthy, "in_flight": b.in_flight,
                     "error": b.last_error}
                    for b in pool.backends
                ],
            }
            for role, pool in self.pools.items()
        }
        missing = [role for role, info in roles.items() if info["ready"] == 0]
        healthy = not missing
        answer: dict[str, Any] = {"mode": self.mode, "roles": roles}
        if self.warmer is not None:
            healthy = healthy and self.warmer.any_warm()
            answer["kv_warmup"] = self.warmer.report()
        if healthy:
            answer["status"] = "ok"
        elif (without := self.degraded.missing_role(self.mode, missing)) is not None:
            # One role can serve every request alone, more slowly (see degraded.py).
            answer["status"] = "degraded"
            answer["degraded"] = without
        else:
            answer["status"] = "unavailable"
        return answer


def report_state(metrics: RouterMetrics, groups: Iterable[Group]) -> None:
    """Set the gauges of ``metrics`` that describe the router's state now, just before a scrape
    (here rather than in metrics.py, which the groups' parts import)."""
    for group in groups:
        revision = group.revision
        for pool in group.pools.values():
            for backend in pool.backends:
                metrics.backend_up.labels(pool.role, backend.url, revision).set(
                    1 if backend.healthy else 0)
                metrics.in_flight.labels(pool.role, backend.url, revision).set(backend.in_flight)
            for backend in pool.draining:
                metrics.backend_up.labels(pool.role, backend.url, revision).set(0)
                metrics.in_flight.labels(pool.role, backend.url, revision).set(backend.in_flight)
        placer = group.placer
        if placer is not None:
            metrics.prefill_queue_depth.labels(revision).set(placer.queue.depth)
            metrics.adaptive_local_max_tokens.labels(revision).set(placer.local_max_tokens())
            metrics.prefill_speed.labels("remote", revision).set(
                placer.remote_speed.tokens_per_s or 0)
            metrics.prefill_speed.labels("local", revision).set(placer.local_speed.tokens_per_s or 0)
            metrics.prefill_busy_fraction.labels(revision).set(placer.queue.busy.fraction())


def build_group(config: RouterConfig, metrics: RouterMetrics, revision: str, mode: str,
                urls: Mapping[str, Sequence[str]], weight: int,
                warmup: WarmupPrompt | None) -> Group:
    """A group of ``mode`` with the workers ``urls`` (by role), its policies and placer from
    ``config``. Its sessions are opened by Group.open."""
    policies = {"prefill": config.prefill_policy, "decode": config.decode_policy,
                "colocated": config.colocated_policy}
    breaker = Breaker(config.breaker_failures, config.breaker_cooldown_s,
                      on_open=lambda b: metrics.breaker_opened.labels(b.role, b.url).inc())
    pools = {
        role: Pool(role, tuple(urls.get(role, ())),
                   make_policy(policies[role], prefix_block_size=config.prefix_block_size,
                               prefix_blocks=config.prefix_blocks),
                   worker_key=config.worker_key, breaker=breaker)
        for role in ROLES[mode]
    }
    placer = None
    if mode == "pd" and config.pd_policy == "pd_adaptive":
        placer = AdaptivePlacer(floor_tokens=config.local_prefill_max_tokens,
                                stall_budget_s=config.stall_budget_ms / 1000,
                                queue=PrefillQueue(config.prefill_slots))
    calls = WorkerCalls(config, pools, metrics, revision)
    degraded = DegradedMode(config.degraded_mode, metrics, revision)
    prefill_stage = (PrefillStage(config, pools["prefill"], calls, metrics, placer,
                                  uses_transfer_params(config.kv_channel))
                     if mode == "pd" else None)
    warmer = None
    if mode == "pd" and warmup is not None:
        warmer = PairWarmer(pools["prefill"], pools["decode"], config.served_model_name,
                            warmup.ids, vocab_size=warmup.vocab_size)
    return Group(revision=revision, mode=mode, pools=pools, calls=calls,
                 forwarder=Forwarder(calls, metrics, placer, degraded), placer=placer,
                 prefill_stage=prefill_stage, warmer=warmer, degraded=degraded, weight=weight)
