"""Keeping a running router's pools equal to its plan, through the router's admin API.

A router is started with the plan's workers on its command line and is never restarted for a
plan change. When a running plan gains an instance, the supervisor starts the worker and, once
it is ready, adds it to the router's pool; when a plan loses one, the router first drains it
(no new requests; the ones in flight finish) and only then does the supervisor stop it, so no
request in flight is dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import admin_token, admin_url
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.supervisor")

SYNC_EVERY_S = 2.0
ADMIN_TIMEOUT_S = 2.0
# A removed worker still busy after this long is stopped anyway; in-flight requests on it then
# fail like on any dead worker (SSE error event, or a retry for a prefill).
DRAIN_LIMIT_S = 120.0


@dataclass
class PoolSync:
    sync_every_s: float = SYNC_EVERY_S
    drain_limit_s: float = DRAIN_LIMIT_S
    last_sync: float = 0.0
    # (deployment id, worker url) -> when its drain started
    draining: dict[tuple[int, str], float] = field(default_factory=dict)

    def step(self) -> bool:
        """Add each running router's ready planned workers that it does not have yet."""
        now = time.monotonic()
        if now - self.last_sync < self.sync_every_s:
            return False
        self.last_sync = now
        added = False
        routers = ManagedProcess.objects.filter(role="router", state=ManagedProcess.State.READY,
                                                deployment__desired_state=Deployment.DesiredState.RUNNING)
        for deployment in Deployment.objects.filter(pk__in=routers.values("deployment")):
            members = self._members(deployment)
            if members is None:
                continue
            ready = {p.slot for p in deployment.processes.filter(state=ManagedProcess.State.READY)}
            for worker in deployment.workers.all():
                if worker.slot in ready and (worker.role, worker.url) not in members:
                    added = self._add(deployment, worker) or added
        return added

    def drained(self, deployment: Deployment, role: str, url: str) -> bool:
        """Whether a worker that left ``deployment``'s plan may be stopped now: its router has
        finished its requests (or has none of them, or is not running)."""
        if role == "router" or deployment.desired_state != Deployment.DesiredState.RUNNING:
            return True
        key = (deployment.pk, url)
        members = self._members(deployment, include_draining=True)
        if members is None or all(member_url != url for _role, member_url in members):
            self.draining.pop(key, None)
            return True
        if key not in self.draining:
            self.draining[key] = time.monotonic()
            self._remove(deployment, role, url)
            return False
        if time.monotonic() - self.draining[key] > self.drain_limit_s:
            log.warning("%s: %s still busy after %.0f s of draining; stopping it", deployment.name,
                        url, self.drain_limit_s)
            self.draining.pop(key)
            return True
        return False

    # ---- the admin API ---------------------------------------------------------------
    def _members(self, deployment: Deployment,
                 include_draining: bool = False) -> set[tuple[str, str]] | None:
        try:
            response = httpx.get(f"{admin_url(deployment)}/backends", timeout=ADMIN_TIMEOUT_S,
                                 headers=_auth(deployment))
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return {(role, backend["url"])
                for role, pool in response.json()["roles"].items()
                for backend in pool["backends"]
                if include_draining or backend["state"] != "draining"}

    def _add(self, deployment: Deployment, worker: WorkerPlan) -> bool:
        try:
            response = httpx.post(f"{admin_url(deployment)}/backends", timeout=ADMIN_TIMEOUT_S,
                                  headers=_auth(deployment),
                                  json={"role": worker.role, "url": worker.url})
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
        try:
            response = httpx.delete(f"{admin_url(deployment)}/backends", timeout=ADMIN_TIMEOUT_S,
                                    headers=_auth(deployment), params={"role": role, "url": url})
        except httpx.HTTPError as exc:
            log.warning("%s: draining %s failed: %s", deployment.name, url, exc)
            return
        log.info("%s: %s %s draining in the router (%d)", deployment.name, role, url,
                 response.status_code)


def _auth(deployment: Deployment) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token(deployment)}"}
