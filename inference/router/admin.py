"""The router's admin API: list, add and remove pool members at run time.

    GET    /admin/backends
    POST   /admin/backends                      {"role": "prefill", "url": "http://127.0.0.1:8101"}
    DELETE /admin/backends?role=prefill&url=http://127.0.0.1:8101

It is guarded by its own bearer token (``PDSERVE_ROUTER_ADMIN_TOKEN``), never the inference API
key, and answers 404 to everything while no token is configured. A removed backend takes no new
requests at once and is closed when its in-flight requests have finished (see backends.py).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

from inference.router.backends import Backend
from inference.router.client_input import parse_json
from inference.router.keys_admin import KeysAdmin
from inference.router.prompts import RequestError

if TYPE_CHECKING:
    from inference.router.server import Router

PATH = "/admin/backends"


class AdminAPI:
    def __init__(self, router: Router, token: str | None):
        self.router = router
        self.token = token

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PATH, self.list_backends)
        app.router.add_post(PATH, self.add_backend)
        app.router.add_delete(PATH, self.remove_backend)
        KeysAdmin(self.router.gate, self._denied).add_routes(app)

    def _denied(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            return _error(404, "the admin API is disabled (set PDSERVE_ROUTER_ADMIN_TOKEN to enable it)",
                          code="admin_disabled")
        supplied = request.headers.get("Authorization", "")
        if hmac.compare_digest(supplied.encode("utf-8", "surrogateescape"),
                               f"Bearer {self.token}".encode()):
            return None
        return web.json_response(
            RequestError(401, "missing or invalid admin token (send 'Authorization: Bearer "
                              "<PDSERVE_ROUTER_ADMIN_TOKEN>')", code="invalid_admin_token").body(),
            status=401, headers={"WWW-Authenticate": "Bearer"})

    async def list_backends(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        return web.json_response({
            "mode": self.router.config.mode,
            "roles": {
                role: {
                    "policy": pool.policy.name,
                    "backends": [describe(b) for b in [*pool.backends, *pool.draining]],
                }
                for role, pool in self.router.pools.items()
            },
        })

    async def add_backend(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        try:
            body = parse_json(await request.read())
            if not isinstance(body, dict):
                raise RequestError(400, 'the body must be a JSON object {"role": ..., "url": ...}')
            role = self._role(body.get("role"))
            url = backend_url(body.get("url"))
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.param)
        try:
            backend = await self.router.add_backend(role, url)
        except ValueError as exc:
            return _error(409, str(exc), "url", code="backend_exists")
        return web.json_response(describe(backend), status=201)

    async def remove_backend(self, request: web.Request) -> web.Response:
        if (denied := self._denied(request)) is not None:
            return denied
        try:
            role = self._role(request.query.get("role"))
            url = request.query.get("url")
            if not url:
                raise RequestError(400, "query parameter 'url' is required", param="url")
        except RequestError as exc:
            return _error(exc.status, exc.message, exc.param)
        try:
            backend = self.router.remove_backend(role, url.rstrip("/"))
        except KeyError:
            return _error(404, f"{url} is not a {role} backend", "url", code="backend_not_found")
        return web.json_response(describe(backend), status=202)

    def _role(self, role: Any) -> str:
        roles = ", ".join(self.router.pools)
        if not isinstance(role, str) or not role:
            raise RequestError(400, f"'role' is required: one of {roles}", param="role")
        if role not in self.router.pools:
            raise RequestError(400, f"'role' must be one of {roles} in {self.router.config.mode} mode, "
                                    f"not {role!r}", param="role")
        return role


def backend_url(value: Any) -> str:
    """A worker's base URL as the router stores it: http(s)://host[:port], no trailing slash."""
    if not isinstance(value, str) or not value:
        raise RequestError(400, "'url' is required: a worker's base URL such as http://127.0.0.1:8100",
                           param="url")
    try:
        url = URL(value)
        port = url.port
    except ValueError as exc:
        raise RequestError(400, f"'url' is not a valid URL: {exc}", param="url") from exc
    if url.scheme not in ("http", "https") or not url.host or not port:
        raise RequestError(400, f"'url' must be http(s)://host[:port], got {value!r}", param="url")
    if url.path not in ("", "/") or url.query_string or url.fragment or url.user or url.password:
        raise RequestError(400, f"'url' must be a base URL without path, query or credentials, "
                                f"got {value!r}", param="url")
    return value.rstrip("/")


def describe(backend: Backend) -> dict[str, Any]:
    state = "draining" if backend.draining else "ready" if backend.healthy else "not_ready"
    return {"role": backend.role, "url": backend.url, "state": state,
            "in_flight": backend.in_flight, "error": backend.last_error}


def _error(status: int, message: str, param: str | None = None,
           code: str | None = None) -> web.Response:
    return web.json_response(RequestError(status, message, param=param, code=code).body(),
                             status=status)
