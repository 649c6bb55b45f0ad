"""The rollout runner's calls to the deployment's router (console/control/rollout_runner.py):
its revision groups and their weights kept equal to the stored ones, groups drained, members
joined or removed, and the per-revision metrics the analysis reads."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from django.utils import timezone

from console.control.worker_specs import green_workers
from console.deployments.models import Deployment
from console.gateway.router_admin import AdminUnreadable, admin_get, admin_headers, admin_url
from console.rollouts import analysis
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.rollouts")
State = Rollout.State
Strategy = Rollout.Strategy
ADMIN_TIMEOUT_S = 2.0
# The states in which the router's groups and weights follow the stored ones.
WHILE_ROUTING = (State.RELEASING, State.STEPPING, State.WARM, State.DRAINING, State.ROLLING_BACK)


class RouterGroups:
    def _sync_router(self, rollout: Rollout) -> None:
        """Make the router's groups and weights the stored ones: green's group exists once green
        passed its gate, with the stored weights."""
        deployment = rollout.deployment
        if rollout.state not in WHILE_ROUTING and not (
                rollout.state == State.PAUSED and rollout.paused_from in WHILE_ROUTING):
            return
        if not self._router_ready(deployment):
            return
        groups = self._groups(deployment)
        green = rollout.green.label
        if green not in groups and self._serving_green(rollout):
            self._add_group(rollout)
            groups = self._groups(deployment)
        elif green in groups and rollout.strategy == Strategy.IN_PLACE and (
                rollout.state != State.ROLLING_BACK):
            self._join_green_members(rollout, groups[green])
        wanted = {label: weight for label, weight in rollout.weights.items()
                  if label in groups and groups[label]["state"] != "draining"}
        current = {label: groups[label]["weight"] for label in wanted}
        if wanted and wanted != current:
            self._put_weights(deployment, wanted)

    def _add_group(self, rollout: Rollout) -> None:
        deployment = rollout.deployment
        pools: dict[str, list[str]] = {}
        for worker in self._serving_green(rollout):
            pools.setdefault(worker.role, []).append(worker.url)
        body = {"revision": rollout.green.label, "mode": rollout.green.spec["mode"],
                "weight": 0, **pools}
        response = self._admin("POST", deployment, "/groups", json=body)
        if response.status_code not in (201, 409):
            raise AdminUnreadable(f"POST /admin/groups: {response.status_code} "
                                  f"{response.text[:300]}")

    def _serving_green(self, rollout: Rollout) -> list[Any]:
        """Green's workers that take traffic: all, or in place the pairs green holds."""
        workers = green_workers(rollout.deployment, rollout)
        if rollout.strategy != Strategy.IN_PLACE:
            return workers
        held = set(rollout.units.get("green", []))
        return [w for w in workers if w.index in held]

    def _join_green_members(self, rollout: Rollout, group: dict[str, Any]) -> None:
        """In place, a pair green took since its group was made joins it."""
        present = {(role, b["url"]) for role, pool in group["roles"].items()
                   for b in pool["backends"]}
        for worker in self._serving_green(rollout):
            if (worker.role, worker.url) in present:
                continue
            response = self._admin("POST", rollout.deployment, "/backends", json={
                "role": worker.role, "url": worker.url, "revision": rollout.green.label})
            if response.status_code not in (201, 409):
                raise AdminUnreadable(f"POST /admin/backends: {response.status_code} "
                                      f"{response.text[:300]}")

    def _put_weights(self, deployment: Deployment, weights: dict[str, int]) -> None:
        response = self._admin("PUT", deployment, "/groups/weights", json={"weights": weights})
        if response.status_code != 200:
            raise AdminUnreadable(f"PUT /admin/groups/weights: {response.status_code} "
                                  f"{response.text[:300]}")

    def _delete_group(self, rollout: Rollout, label: str) -> None:
        if not self._router_ready(rollout.deployment):
            return
        response = self._admin("DELETE", rollout.deployment, f"/groups/{label}")
        if response.status_code not in (202, 404):
            raise AdminUnreadable(f"DELETE /admin/groups/{label}: {response.status_code} "
                                  f"{response.text[:300]}")

    def _drained(self, rollout: Rollout, label: str) -> bool:
        """Whether ``label``'s group is gone from the router (drained), or its drain timed out,
        or no router runs to hold its requests."""
        if not self._router_ready(rollout.deployment):
            return True
        if label not in self._groups(rollout.deployment):
            return True
        waited = (timezone.now() - rollout.state_since).total_seconds()
        if waited > rollout.drain_timeout_s:
            log.warning("rollout #%d: r%s still draining after %d s; its workers are stopped",
                        rollout.pk, label, rollout.drain_timeout_s)
            return True
        return False

    def _groups(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        data = admin_get(deployment, "/groups", timeout_s=ADMIN_TIMEOUT_S)
        try:
            return {group["revision"]: group for group in data["groups"]}
        except (KeyError, TypeError) as exc:
            raise AdminUnreadable(f"GET /admin/groups: not a group listing ({exc!r})") from exc

    @staticmethod
    def _router_ready(deployment: Deployment) -> bool:
        return deployment.processes.filter(role="router",
                                           state=ManagedProcess.State.READY).exists()

    @staticmethod
    def _admin(method: str, deployment: Deployment, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return httpx.request(method, f"{admin_url(deployment)}{path}",
                                 headers=admin_headers(deployment), timeout=ADMIN_TIMEOUT_S,
                                 **kwargs)
        except httpx.HTTPError as exc:
            raise AdminUnreadable(f"{method} /admin{path}: {type(exc).__name__}: {exc}") from exc

    def _scrape(self, deployment: Deployment) -> analysis.Scrape:
        url = admin_url(deployment).removesuffix("/admin") + "/metrics"
        try:
            response = httpx.get(url, timeout=ADMIN_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise AdminUnreadable(f"GET /metrics: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise AdminUnreadable(f"GET /metrics: {response.status_code}")
        return analysis.parse(response.text)

    def _put_router_weights(self, rollout: Rollout) -> None:
        if not self._router_ready(rollout.deployment):
            return
        groups = self._groups(rollout.deployment)
        wanted = {label: weight for label, weight in rollout.weights.items()
                  if label in groups and groups[label]["state"] != "draining"}
        if wanted:
            self._put_weights(rollout.deployment, wanted)

    def _remove_members(self, rollout: Rollout, urls: list[tuple[str, str]]) -> None:
        if not self._router_ready(rollout.deployment):
            return
        for role, url in urls:
            self._admin("DELETE", rollout.deployment, "/backends",
                        params={"role": role, "url": url, "revision": rollout.green.label})

