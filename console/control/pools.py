"""Keeping a running router's pools equal to its plan, through the router's admin API.

A router is started with the plan's workers on its command line and is never restarted for a
plan change. When a running plan gains an instance, the supervisor starts the worker and, once
it is ready, adds it to the router's pool; when a plan loses one, the router first drains it
(no new requests; the ones in flight finish) and only then does the supervisor stop it, so no
request in flight is dropped.

Unknown is never done: a worker whose drain state cannot be read (the router runs but its admin
API times out, refuses or answers nonsense) keeps running and is asked about again on later
ticks; only at the drain limit is it stopped, with a log line that says why. "Nothing to drain"
is only said when no router process runs or the deployment is stopping.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import (
    AdminUnreadable,
    admin_headers,
    admin_url,
    pool_members,
    router_running,
)
from console.rollouts.revisions import live_number
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.supervisor")

SYNC_EVERY_S = 2.0
ADMIN_TIMEOUT_S = 2.0
# A removed worker still busy after this long, or whose drain could not be read for this long,
# is stopped anyway; in-flight requests on it then fail like on any dead worker (SSE error
# event, or a retry for a prefill).
DRAIN_LIMIT_S = 120.0


@dataclass
class Drain:
    """A worker that left its plan, from the first time the supervisor asked to stop it."""
    started: float
    # Since when, and why, its router's admin API has given no answer (None: it answered last).
    unreadable_since: float | None = None
    last_error: str = ""


@dataclass
class PoolSync:
    sync_every_s: float = SYNC_EVERY_S
    drain_limit_s: float = DRAIN_LIMIT_S
    admin_timeout_s: float = ADMIN_TIMEOUT_S
    last_sync: float = 0.0
    # (deployment id, worker url) -> its drain
    draining: dict[tuple[int, str], Drain] = field(default_factory=dict)
    # Deployments whose router's admin API did not answer step()'s last read (logged once).
    unreadable: set[int] = field(default_factory=set)
    # (deployment id, worker url) -> the revision group the router last listed it in
    revisions: dict[tuple[int, str], str] = field(default_factory=dict)

    def step(self) -> bool:
        """Add each running router's ready planned workers that it does not have yet."""
        now = time.monotonic()
        if now - self.last_sync < self.sync_every_s:
            return False
        self.last_sync = now
        added = False
        routers = ManagedProcess.objects.filter(role="router", state=ManagedProcess.State.READY,
                                                deployment__desired_state=Deployment.DesiredState.RUNNING)
        deployments = list(Deployment.objects.filter(pk__in=routers.values("deployment")))
        self.unreadable &= {d.pk for d in deployments}
        for deployment in deployments:
            try:
                states = self._members(deployment)
            except AdminUnreadable as exc:
                # Its pools are unknown: add nothing (a worker may be a member already); the
                # next sync asks again.
                if deployment.pk not in self.unreadable:
                    log.warning("%s: router admin API unreadable (%s); no worker is added until "
                                "it answers", deployment.name, exc)
                    self.unreadable.add(deployment.pk)
                continue
            if deployment.pk in self.unreadable:
                log.info("%s: router admin API answers again", deployment.name)
                self.unreadable.discard(deployment.pk)
            members = {member for member, state in states.items() if state != "draining"}
            ready = {p.slot for p in deployment.processes.filter(state=ManagedProcess.State.READY)}
            for worker in deployment.workers.all():
                if worker.slot in ready and (worker.role, worker.url) not in members:
                    added = self._add(deployment, worker) or added
        return added

    def drained(self, deployment: Deployment, role: str, url: str) -> bool:
        """Whether a worker that left ``deployment``'s plan may be stopped now: its router has
        finished its requests or never had it, no router runs, or the drain limit is reached.
        The first call asks the router to drain it (and later ones again until it did)."""
        key = (deployment.pk, url)
        if (role == "router" or deployment.desired_state != Deployment.DesiredState.RUNNING
                or not router_running(deployment)):
            self.draining.pop(key, None)  # nothing to drain: no router holds its requests
            return True
        now = time.monotonic()
        drain = self.draining.setdefault(key, Drain(started=now))
        try:
            state = self._members(deployment).get((role, url))
        except AdminUnreadable as exc:
            if drain.unreadable_since is None:
                drain.unreadable_since = now
                log.warning("%s: cannot read whether %s is drained (%s); it keeps running and is "
                            "asked about again", deployment.name, url, exc)
            drain.last_error = str(exc)
        else:
            drain.unreadable_since = None
            if state is None:
                self.draining.pop(key)
                return True
            if state != "draining":
                self._remove(deployment, role, url)
        if now - drain.started <= self.drain_limit_s:
            return False
        if drain.unreadable_since is not None:
            log.warning("%s: router admin API unreadable for %.0f s (last error: %s); stopping "
                        "%s anyway", deployment.name, now - drain.unreadable_since,
                        drain.last_error, url)
        else:
            log.warning("%s: %s still busy after %.0f s of draining; stopping it", deployment.name,
                        url, self.drain_limit_s)
        self.draining.pop(key)
        return True

    # ---- the admin API ---------------------------------------------------------------
    def _members(self, deployment: Deployment) -> dict[tuple[str, str], str]:
        """(role, url) -> state ("ready", "not_ready", "draining") of every member of the
        router's pools. Raises ``AdminUnreadable`` when the router gives no such list."""
        members = pool_members(deployment, timeout_s=self.admin_timeout_s)
        # During a rollout the router holds two revision groups: a removal names the one.
        self.revisions.update({(deployment.pk, m.url): m.revision for m in members})
        return {(m.role, m.url): m.state for m in members}

    def _add(self, deployment: Deployment, worker: WorkerPlan) -> bool:
        try:
            response = httpx.post(f"{admin_url(deployment)}/backends", timeout=self.admin_timeout_s,
                                  headers=admin_headers(deployment),
                                  # The plan's workers are the live revision's group's.
                                  json={"role": worker.role, "url": worker.url,
                                        "revision": str(live_number(deployment) or 1)})
        except httpx.HTTPError as exc:
            log.warning("%s: adding %s to the router failed: %s", deployment.name, worker.url, exc)
            return False
        if response.status_code != 201:
            log.warning("%s: the router refused %s: %d %s", deployment.name, worker.url,
                        response.status_code, response.text[:300])
            return False
        log.info("%s: %s %s added to the router", deployment.name, worker.role, worker.url)
        return True

    def _remove(self, deployment: Deployment, role: str, url: str) -> None:
        """Ask the router to drain ``url``. A failure is logged; drained() sees the member still
        in rotation on its next call and asks again."""
        params = {"role": role, "url": url}
        if revision := self.revisions.get((deployment.pk, url)):
            params["revision"] = revision
        try:
            response = httpx.delete(f"{admin_url(deployment)}/backends", timeout=self.admin_timeout_s,
                                    headers=admin_headers(deployment), params=params)
        except httpx.HTTPError as exc:
            log.warning("%s: asking the router to drain %s failed (%s: %s)", deployment.name, url,
                        type(exc).__name__, exc)
            return
        if response.status_code == 202:
            log.info("%s: %s %s draining in the router", deployment.name, role, url)
        elif response.status_code == 404:
            log.info("%s: %s %s is no longer in the router", deployment.name, role, url)
        else:
            log.warning("%s: the router refused to drain %s: %d %s", deployment.name, url,
                        response.status_code, response.text[:300])

