"""The router's admin API: list, add and remove pool members at run time.

    GET    /admin/backends
    POST   /admin/backends      {"role": "prefill", "url": "http://127.0.0.1:8101", "revision": "2"}
    DELETE /admin/backends?role=prefill&url=http://127.0.0.1:8101&revision=2
    GET    /admin/usage?since=2026-12-01   the usage ledger (usage.py), cumulative per day and key

``revision`` names the group (see groups.py and groups_admin.py); it may be left out while the
router has one group. It is guarded by its own bearer token (``PDSERVE_ROUTER_ADMIN_TOKEN``),
never the inference API key, and answers 404 to everything while no token is configured. A
removed backend takes no new requests at once and is closed when its in-flight requests have
finished (see backends.py).
"""

from __future__ import annotations

import hmac
from typing import Any

from aiohttp import web

from inference.router.admin_shapes import RouterControl, backend_url, describe
from inference.router.budgets import BudgetMeter
from inference.router.client_input import parse_json
from inference.router.errors import RequestError, error_response
from inference.router.groups import DRAINING, Group
from inference.router.groups_admin import GroupsAdmin
from inference.router.keys import Gatekeeper
from inference.router.keys_admin import KeysAdmin
from inference.router.usage import UsageLedger, UsageUnavailable, check_day

PATH = "/admin/backends"


class AdminAPI:
    def __init__(self, router: RouterControl, gate: Gatekeeper, budgets: BudgetMeter,
                 token: str | None, usage: UsageLedger):
        self.router = router
        self.gate = gate
        self.budgets = budgets
        self.token = token
        self.usage = usage

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PATH, self.list_backends)
        app.router.add_post(PATH, self.add_backend)
        app.router.add_delete(PATH, self.remove_backend)
        app.router.add_get("/admin/usage", self.usage_rows)
        KeysAdmin(self.gate, self._denied, self.budgets).add_routes(app)
        GroupsAdmin(self.router, self._denied).add_routes(app)

    def _denied(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            return error_response(404, "the admin API is disabled (set "
                                  "PDSERVE_ROUTER_ADMIN_TOKEN to enable it)",
                                  code="admin_disabled")
        supplied = request.headers.get("Authorization", "")
        if hmac.compare_digest(supplied.encode("utf-8", "surrogateescape"),
                               f"Bearer {self.token}".encode()):
            return None
        return error_response(401, "missing or invalid admin token (send 'Authorization: Bearer "
                              "<PDSERVE_ROUTER_ADMIN_TOKEN>')", code="invalid_admin_token",
                              headers={"WWW-Authenticate": "Bearer"})

    async def list_backends(self, request: web.Request) -> web.Response:
        """Every group's members by role (each naming its revision); ``mode`` and each role's
        policy are the primary group's, or the first group's that has the role."""
        if (denied := self._denied(request)) is not None:
            return denied
        roles: dict[str, dict[str, Any]] = {}
        for group in self.router.groups.values():
            for role, pool in group.pools.items():
                listed = roles.setdefault(role, {"policy": pool.policy.name, "backends": []})
                listed["backends"] += [{**describe(b), "revision": group.revision}
                                       for b in [*pool.backends, *pool.draining]]
        return web.json_response({"mode": self.router.primary.mode, "roles": roles})

    async def usage_rows(self, request: web.Request) -> web.Response:
        """The usage ledger's rows: what its file holds plus what is not written yet, sorted by
        day then key; ``since`` keeps the days from that one on."""
        if (denied := self._denied(request)) is not None:
            return denied
        since = request.query.get("since")
        try:
            if since is not None:
                check_day(since)
        except ValueError as exc:
            return error_response(400, str(exc), param="since")
        try:
            rows = await self.usage.rows(since)
        except UsageUnavailable as exc:
            return error_response(503, str(exc), code="usage_unavailable")
        return web.json_response({"version": 1, "rows": rows})

    async def add_backend(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        try:
            body = parse_json(await request.read())
            if not isinstance(body, dict):
                raise RequestError(400, 'the body must be a JSON object {"role": ..., "url": ...}')
            group = self._group(body.get("revision"))
            if group.state == DRAINING:
                raise RequestError(409, f"revision {group.revision} is draining", param="revision",
                                   code="group_draining")
            role = self._role(group, body.get("role"))
            url = backend_url(body.get("url"))
        except RequestError as exc:
            return exc.response()
        try:
            backend = await self.router.add_backend(role, url, group)
        except ValueError as exc:
            return error_response(409, str(exc), param="url", code="backend_exists")
        return web.json_response(describe(backend), status=201)

    async def remove_backend(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        try:
            group = self._group(request.query.get("revision"))
            role = self._role(group, request.query.get("role"))
            url = request.query.get("url")
            if not url:
                raise RequestError(400, "query parameter 'url' is required", param="url")
        except RequestError as exc:
            return exc.response()
        try:
            backend = self.router.remove_backend(role, url.rstrip("/"), group)
        except KeyError:
            return error_response(404, f"{url} is not a {role} backend", param="url",
                                  code="backend_not_found")
        return web.json_response(describe(backend), status=202)

    def _group(self, revision: Any) -> Group:
        groups = self.router.groups
        if revision is None:
            if len(groups) > 1:
                raise RequestError(400, f"'revision' is required while the router has "
                                        f"{len(groups)} groups: one of {', '.join(groups)}",
                                   param="revision")
            return next(iter(groups.values()))
        if not isinstance(revision, str) or revision not in groups:
            raise RequestError(404, f"no revision group {revision!r} (there are: "
                                    f"{', '.join(groups)})", param="revision",
                               code="group_not_found")
        return groups[revision]

    def _role(self, group: Group, role: Any) -> str:
        roles = ", ".join(group.pools)
        if not isinstance(role, str) or not role:
            raise RequestError(400, f"'role' is required: one of {roles}", param="role")
        if role not in group.pools:
            raise RequestError(400, f"'role' must be one of {roles} in {group.mode} mode, "
                                    f"not {role!r}", param="role")
        return role
