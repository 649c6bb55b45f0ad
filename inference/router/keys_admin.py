"""The admin API for inference keys (behind the admin token, like /admin/backends):

    PUT /admin/keys          the whole key set (see keys.py); answers its version and size
    GET /admin/keys          the key set without hashes: id, prefix, state, limits (the key's
                             on this router's model, and its per-model overrides), team,
                             budgets with this router's estimate of what is spent
    GET /admin/keys/usage    per key id: last use (Unix time) and counts since the router started

The console pushes the set whenever a key changes and reads usage to record ``last_used_at``.
A new set applies from the next request; requests in flight keep the key they were admitted with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict

from aiohttp import web

from inference.router.budgets import BudgetMeter
from inference.router.client_input import parse_json
from inference.router.errors import RequestError
from inference.router.keys import Gatekeeper

log = logging.getLogger("pdserve.router")

PATH = "/admin/keys"


class KeysAdmin:
    def __init__(self, gate: Gatekeeper, denied: Callable[[web.Request], web.Response | None],
                 budgets: BudgetMeter):
        self.gate = gate
        self.denied = denied
        self.budgets = budgets

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(PATH, self.list_keys)
        app.router.add_put(PATH, self.replace_keys)
        app.router.add_get(f"{PATH}/usage", self.usage)

    async def list_keys(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        key_set = self.gate.key_set
        return web.json_response({
            "version": key_set.version,
            "require_key": key_set.require_key,
            "open": self.gate.open,
            "keys": [{"id": key.id, "prefix": key.prefix, "state": key.state,
                      "limits": asdict(key.limits), "model_limits": key.model_limits,
                      "team": key.team,
                      "budget": asdict(key.budget) if key.budget is not None else None,
                      "team_budget": asdict(key.team_budget) if key.team_budget else None,
                      "spent": self.budgets.spent(key)} for key in key_set.keys],
        })

    async def replace_keys(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        try:
            key_set = self.gate.replace(parse_json(await request.read()))
        except RequestError as exc:
            return exc.response()
        log.info("key set %s: %d keys, key %s", key_set.version, len(key_set.by_prefix),
                 "required" if not self.gate.open else "not required")
        return web.json_response({"version": key_set.version, "keys": len(key_set.by_prefix),
                                  "open": self.gate.open})

    async def usage(self, request: web.Request) -> web.Response:
        if (denied := self.denied(request)) is not None:
            return denied
        return web.json_response(self.gate.usage())
