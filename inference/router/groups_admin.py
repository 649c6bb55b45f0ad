"""The admin API for revision groups (behind the admin token, like /admin/backends):

    GET    /admin/groups                every group with its weight, state and members, and the
                                        sticky sessions each holds
    POST   /admin/groups                {"revision": "2", "mode": "pd", "prefill": [url, ...],
                                         "decode": [url, ...], "weight": 0}; or "colocated": [...]
    PUT    /admin/groups/weights        {"weights": {"1": 90, "2": 10}}: all or nothing
    DELETE /admin/groups/<revision>     out of selection now, drained, then removed

A rollout adds the new revision at weight 0, moves weight over in steps, and deletes the old
one; a rollback sets the new revision's weight to 0 (no request reaches it from then on) and
deletes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from inference.router.admin_shapes import RouterControl, backend_url, describe
from inference.router.client_input import parse_json
from inference.router.config import REVISION_LABEL
from inference.router.errors import RequestError, error_response
from inference.router.groups import DRAINING, ROLES, Group, LastGroup

PATH = "/admin/groups"
FIELDS = ("revision", "mode", "weight", "prefill", "decode", "colocated")
MAX_WEIGHT = 1_000_000


class GroupsAdmin:
    def __init__(self, router: RouterControl, denied: Callable[[web.Request], web.Response | None]):
        self.router = router
        self.denied = denied

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PATH, self.list_groups)
        app.router.add_post(PATH, self.add_group)
        app.router.add_put(f"{PATH}/weights", self.set_weights)
        app.router.add_delete(PATH + "/{revision}", self.remove_group)

    async def list_groups(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        return web.json_response(self._listing())

    async def add_group(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        try:
            body = parse_json(await request.read())
            if not isinstance(body, dict):
                raise RequestError(400, 'the body must be a JSON object {"revision": ..., "mode": '
                                        '..., "weight": ..., and the workers of each role}')
            if unknown := sorted(set(body) - set(FIELDS)):
                raise RequestError(400, f"unknown field '{unknown[0]}' (known: {', '.join(FIELDS)})",
                                   param=unknown[0])
            revision = _revision(body.get("revision"))
            mode = body.get("mode")
            if mode not in ROLES:
                raise RequestError(400, f"'mode' must be one of {', '.join(ROLES)}, not {mode!r}",
                                   param="mode")
            urls = _pools(mode, body)
            weight = _weight(body.get("weight", 0), "weight")
        except RequestError as exc:
            return exc.response()
        try:
            group = await self.router.add_group(revision, mode, urls, weight)
        except ValueError as exc:
            return error_response(409, str(exc), param="revision", code="group_exists")
        return web.json_response(view(group), status=201)

    async def set_weights(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        groups = self.router.groups
        try:
            body = parse_json(await request.read())
            weights = body.get("weights") if isinstance(body, dict) else None
            if not isinstance(weights, dict) or not weights:
                raise RequestError(400, "'weights' is required: an object of revision -> weight, "
                                        'such as {"1": 90, "2": 10}', param="weights")
            # Every entry is checked before any applies: a half-applied split is a split no one
            # asked for.
            for revision, weight in weights.items():
                param = f"weights.{revision}"
                if revision not in groups:
                    raise RequestError(400, f"no revision group {revision!r} (there are: "
                                            f"{', '.join(groups)})", param=param)
                _weight(weight, param)
                if weight and groups[revision].state == DRAINING:
                    raise RequestError(400, f"revision {revision} is draining: its weight stays 0",
                                       param=param)
        except RequestError as exc:
            return exc.response()
        self.router.set_weights(weights)
        return web.json_response(self._listing())

    async def remove_group(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        revision = request.match_info["revision"]
        try:
            group = self.router.remove_group(revision)
        except KeyError:
            return error_response(404, f"no revision group {revision!r}", param="revision",
                                  code="group_not_found")
        except LastGroup:
            return error_response(409, f"revision {revision} is the only active group; add "
                                  "another before removing it", param="revision", code="last_group")
        return web.json_response(view(group), status=202)

    def _listing(self) -> dict[str, Any]:
        return {"groups": [view(g) for g in self.router.groups.values()],
                "sessions": self.router.selector.sessions()}


def view(group: Group) -> dict[str, Any]:
    return {
        "revision": group.revision,
        "mode": group.mode,
        "weight": group.weight,
        "state": group.state,
        "in_flight": group.in_flight,
        "kv_pending": group.kv_pending,
        "roles": {
            role: {"policy": pool.policy.name,
                   "backends": [{**describe(b), "kv_pending": b.kv_pending}
                                for b in [*pool.backends, *pool.draining]]}
            for role, pool in group.pools.items()
        },
    }


def _revision(value: Any) -> str:
    if not isinstance(value, str) or not REVISION_LABEL.fullmatch(value):
        raise RequestError(400, "'revision' must be a label of 1 to 32 letters, digits, '.', '_' "
                                f"or '-', not {value!r}", param="revision")
    return value


def _weight(value: Any, param: str) -> int:
    # bool is an int to Python, not to a client.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WEIGHT:
        raise RequestError(400, f"'{param}' must be an integer from 0 to {MAX_WEIGHT}, not "
                                f"{value!r}", param=param)
    return value


def _pools(mode: str, body: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """The workers of each role ``mode`` has; a role it has not must be absent or empty."""
    urls: dict[str, tuple[str, ...]] = {}
    for role in ("prefill", "decode", "colocated"):
        value = body.get(role)
        if role not in ROLES[mode]:
            if value:
                raise RequestError(400, f"'{role}' has no place in {mode} mode", param=role)
            continue
        if not isinstance(value, list) or not value:
            raise RequestError(400, f"'{role}' is required in {mode} mode: a list of worker base "
                                    "URLs", param=role)
        listed = tuple(backend_url(url, param=role) for url in value)
        if len(set(listed)) != len(listed):
            raise RequestError(400, f"'{role}' lists a worker twice", param=role)
        urls[role] = listed
    return urls
