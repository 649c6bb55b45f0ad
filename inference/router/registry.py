"""The router's revision groups and their workers, at run time: which groups there are, the
one the top level of /health and /admin/backends describes, and adding, reweighting, draining
and removing groups and workers (the admin API calls these; admin_shapes.RouterControl is what
it sees of them). Requests pick a group through ``selector`` (selection.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from inference.router.backends import Backend, Pool, close_sessions, probe, probe_forever
from inference.router.config import RouterConfig
from inference.router.groups import ACTIVE, DRAINING, Group, LastGroup, WarmupPrompt, build_group
from inference.router.metrics import RouterMetrics
from inference.router.selection import Selector

log = logging.getLogger("pdserve.router")


class Registry:
    def __init__(self, config: RouterConfig, metrics: RouterMetrics,
                 warmup: WarmupPrompt | None):
        self.config = config
        self.metrics = metrics
        self.warmup = warmup
        first = build_group(config, metrics, config.revision, config.mode, config.start_urls(),
                            weight=100, warmup=warmup)
        self.groups: dict[str, Group] = {first.revision: first}
        self.selector = Selector()
        self._prober: asyncio.Task[None] | None = None
        self._drains: dict[Backend, asyncio.Task[None]] = {}
        self._group_drains: set[asyncio.Task[None]] = set()
        self._adding: set[str] = set()  # revisions whose group is being added

    @property
    def primary(self) -> Group:
        """The first active group: what the top-level fields of /health and /admin/backends
        describe, as they did when the router had one set of pools. There is always one: the
        last active group cannot be removed."""
        return next(g for g in self.groups.values() if g.state == ACTIVE)

    def all_pools(self) -> list[Pool]:
        return [pool for group in self.groups.values() for pool in group.pools.values()]

    # ---- lifecycle -------------------------------------------------------------------
    def open(self) -> None:
        """Open every group's sessions and start probing their workers."""
        for group in self.groups.values():
            group.open(self.config.connect_timeout_s)
        self._prober = asyncio.create_task(
            probe_forever(self.all_pools, self.config.health_interval_s))

    async def close(self) -> None:
        tasks = [*self._group_drains, *self._drains.values()]
        if self._prober is not None:
            tasks.append(self._prober)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for group in self.groups.values():
            await group.stop_warmup()
        await close_sessions(self.all_pools())

    # ---- groups and workers at run time ----------------------------------------------
    async def add_group(self, revision: str, mode: str, urls: dict[str, tuple[str, ...]],
                        weight: int) -> Group:
        """Add a revision group; its workers are probed at once and take requests (at its
        weight) once ready. Raises ValueError if ``revision`` is a group already."""
        if revision in self.groups or revision in self._adding:
            raise ValueError(f"revision {revision} is a group already")
        self._adding.add(revision)
        # Shielded: an admin client that leaves must not leave a group half added, its
        # sessions open and no one to close them.
        return await asyncio.shield(self._add_group(revision, mode, urls, weight))

    async def _add_group(self, revision: str, mode: str, urls: dict[str, tuple[str, ...]],
                         weight: int) -> Group:
        group = build_group(self.config, self.metrics, revision, mode, urls, weight, self.warmup)
        group.open(self.config.connect_timeout_s)
        # Probed before it joins, so that no request picks it before its workers are known
        # to be ready.
        try:
            await asyncio.gather(*(probe(b, timeout_s=max(self.config.connect_timeout_s, 0.5))
                                   for b in group.backends()))
        finally:
            # Even when cancelled (the router stops): stop() then closes its sessions.
            self._adding.discard(revision)
            self.groups[revision] = group
        self.selector.reset()
        log.info("revision %s added: %s, weight %d, %s", revision, mode, weight,
                 ", ".join(f"{b.role} {b.url} {'ready' if b.healthy else 'not ready'}"
                           for b in group.backends()))
        return group

    def set_weights(self, weights: dict[str, int]) -> None:
        """Give groups new weights (the caller has checked them all), from the next request on."""
        for revision, weight in weights.items():
            self.groups[revision].weight = weight
            if weight == 0:
                # Their sessions go by weight again rather than back here when it returns.
                self.selector.forget(revision)
        self.selector.reset()
        log.info("revision weights: %s", ", ".join(f"{g.revision}={g.weight}"
                                                   for g in self.groups.values()))

    def remove_group(self, revision: str) -> Group:
        """Take a group out of selection now, then drain and remove it. Raises KeyError if
        there is no such group, LastGroup if it is the only active one."""
        group = self.groups[revision]
        if group.state == DRAINING:
            return group
        if not any(g.state == ACTIVE for g in self.groups.values() if g is not group):
            raise LastGroup(revision)
        group.state, group.weight = DRAINING, 0
        self.selector.forget(revision)
        self.selector.reset()
        task = asyncio.create_task(self._drain_group(group))
        self._group_drains.add(task)
        task.add_done_callback(self._group_drains.discard)
        log.info("revision %s removed; draining %d requests", revision, group.requests)
        return group

    async def _drain_group(self, group: Group) -> None:
        await group.stop_warmup()
        # Requests inside the group keep its pools for their retries and fallbacks.
        await group.wait_idle()
        for pool in group.pools.values():
            for backend in list(pool.backends):
                self.remove_backend(pool.role, backend.url, group)
        await asyncio.gather(*(self._drains[b] for b in group.backends() if b in self._drains))
        del self.groups[group.revision]
        self.metrics.forget_group(group.revision)
        log.info("revision %s drained and removed", group.revision)

    async def add_backend(self, role: str, url: str, group: Group | None = None) -> Backend:
        """Add a member to ``role``'s pool of ``group`` (the primary one if None); it takes
        requests once a probe finds it healthy. Raises ValueError if it is a member already."""
        group = group or self.primary
        backend = group.pools[role].add(url)
        backend.open(self.config.connect_timeout_s)
        # Probe now rather than at the next round, so the caller learns at once whether the
        # new member is reachable, and a healthy one serves from the next request on.
        await probe(backend, timeout_s=max(self.config.connect_timeout_s, 0.5))
        log.info("revision %s: %s backend %s added (%s)", group.revision, role, url,
                 "ready" if backend.healthy else f"not ready: {backend.last_error}")
        return backend

    def remove_backend(self, role: str, url: str, group: Group | None = None) -> Backend:
        """Take a member of ``group`` (the primary one if None) out of rotation now and close
        it once its requests have finished. Raises KeyError if ``url`` is not a member."""
        group = group or self.primary
        pool = group.pools[role]
        backend = pool.find(url)
        if backend is None:
            raise KeyError(url)
        pool.remove(backend)
        task = asyncio.create_task(self._drain(group, pool, backend))
        self._drains[backend] = task
        task.add_done_callback(lambda _: self._drains.pop(backend, None))
        log.info("revision %s: %s backend %s removed; draining %d in-flight requests, %d KV "
                 "hand-offs", group.revision, role, url, backend.in_flight, backend.kv_pending)
        return backend

    async def _drain(self, group: Group, pool: Pool, backend: Backend) -> None:
        await backend.drain(self.config.kv_lease_s)
        pool.draining.remove(backend)
        if pool.find(backend.url) is None:
            self.metrics.forget_backend(pool.role, backend.url, group.revision)
        log.info("revision %s: %s backend %s drained and closed", group.revision, pool.role,
                 backend.url)
