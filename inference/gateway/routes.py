"""Where a request may go: its key's check and scope, and its model's ordered targets.

A RouteTable is built once per configuration, so that a request costs dictionary look-ups: the
model name to its targets, the key's public prefix to its entry and the frozenset of deployments
it may use (its own and the open ones). A request keeps the table it started with; a new
configuration replaces the whole table in one assignment.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from inference.gateway.config import Deployment, GatewayConfig, Key
from inference.router.errors import RequestError
from inference.router.keys import KEY_PREFIX, AuthFailure, key_hash, public_prefix


@dataclass(frozen=True, slots=True)
class Route:
    model: str
    targets: tuple[Deployment, ...]  # in fallback order
    alias: bool  # the body's model is rewritten to each target's served name

    def allowed(self, scope: frozenset[str] | None) -> tuple[Deployment, ...]:
        if scope is None:
            return self.targets
        return tuple(target for target in self.targets if target.name in scope)


def not_found(model: str) -> RequestError:
    # The same words whether the model is unknown or the key may not use it: a key cannot tell
    # which models other teams serve.
    return RequestError(404, f"The model '{model}' does not exist or you do not have access to it.",
                        param="model", code="model_not_found")


class RouteTable:
    def __init__(self, config: GatewayConfig):
        self.config = config
        by_name = {deployment.name: deployment for deployment in config.deployments}
        serving: dict[str, list[Deployment]] = {}
        for deployment in config.deployments:
            serving.setdefault(deployment.served_model_name, []).append(deployment)
        self.routes: dict[str, Route] = {
            name: Route(name, tuple(targets), alias=False) for name, targets in serving.items()}
        self.routes.update({
            alias.name: Route(alias.name, tuple(by_name[t] for t in alias.targets), alias=True)
            for alias in config.aliases})
        # Open deployments (require_key false) take anyone, as their routers do.
        self.open = frozenset(d.name for d in config.deployments if not d.require_key)
        # Keys are looked at once one deployment needs them: while all are open, whatever a
        # client sends goes on to routers that ignore it too.
        self.checks_keys = config.require_key or len(self.open) < len(config.deployments)
        self.keys: dict[str, tuple[Key, frozenset[str]]] = {
            key.prefix: (key, key.deployments | self.open) for key in config.keys}
        # Keys matter to the gateway's queues only where a deployment has one.
        self.prioritizes = bool(config.keys) and any(d.max_concurrency for d in config.deployments)

    def scope(self, authorization: str) -> frozenset[str] | None:
        """The names of the deployments the caller may use; None: every one (all are open,
        and each deployment's router checks what it is sent). A caller without a key may use
        the open ones, unless the configuration requires a key of every request. Raises
        AuthFailure."""
        return self.caller(authorization)[0]

    def caller(self, authorization: str) -> tuple[frozenset[str] | None, Key | None]:
        """The caller's scope (as ``scope``) and its key, None when it sent none or none is
        checked. Raises AuthFailure."""
        # hot path: runs once per request
        if not self.checks_keys:
            # Every deployment is open: nothing is refused, but a valid key still brings its
            # priority band and team (flow_control.py); any other Authorization is ignored, as
            # the open deployments' routers ignore it.
            return None, self._known(authorization) if self.prioritizes else None
        if not authorization:
            if self.config.require_key:
                raise AuthFailure("missing", "missing API key (send 'Authorization: Bearer <key>')")
            return self.open, None
        entry = self._entry(authorization)
        if entry is None:
            raise AuthFailure("invalid", "invalid API key")
        key, scope = entry
        if key.state == "revoked":
            raise AuthFailure("revoked", f"API key {KEY_PREFIX}{key.prefix}... has been revoked")
        return scope, key

    def _known(self, authorization: str) -> Key | None:
        """The active key ``authorization`` carries, or None (none, unknown, wrong or revoked)."""
        entry = self._entry(authorization)
        return entry[0] if entry is not None and entry[0].state != "revoked" else None

    def _entry(self, authorization: str) -> tuple[Key, frozenset[str]] | None:
        """The key (and scope) whose secret ``authorization`` carries, revoked or not; None for
        none, an unknown prefix or a wrong secret."""
        token = authorization[7:] if authorization[:7].lower() == "bearer " else ""
        prefix = public_prefix(token)
        entry = self.keys.get(prefix) if prefix else None
        if entry is None or not hmac.compare_digest(key_hash(token), entry[0].hash):
            return None
        return entry

    def targets(self, model: str, scope: frozenset[str] | None) -> tuple[Route, tuple[Deployment, ...]]:
        """The model's route and the targets of it the caller may use, in order; raises the 404
        RequestError when there are none, or AuthFailure when the caller sent no key and one
        would open them."""
        route = self.routes.get(model)
        targets = route.allowed(scope) if route is not None else ()
        if route is None or not targets:
            if route is not None and scope is self.open:
                # Sent without a key to a model that needs one: say so, as its own router
                # would, rather than that it does not exist.
                raise AuthFailure("missing", "missing API key (send 'Authorization: Bearer <key>')")
            raise not_found(model)
        return route, targets

    def models(self, scope: frozenset[str] | None) -> list[dict[str, Any]]:
        """The OpenAI model list of what the caller may use: its deployments, then the aliases
        with at least one target it may use."""
        data: list[dict[str, Any]] = [
            {"id": d.served_model_name, "object": "model", "created": 0, "owned_by": d.team,
             "pdserve": {"deployment": d.name, "state": d.state}}
            for d in self.config.deployments if scope is None or d.name in scope]
        for route in self.routes.values():
            targets = route.allowed(scope) if route.alias else ()
            if targets:
                data.append({"id": route.model, "object": "model", "created": 0, "owned_by": "pdserve",
                             "pdserve": {"alias_of": [t.name for t in targets],
                                         "state": targets[0].state}})
        return data
