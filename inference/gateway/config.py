"""The gateway's configuration: which deployments exist and where their routers listen, the
aliases over them, and the inference keys with the deployments each may use (hashes only).

It arrives as JSON, from ``--config-file`` at start and from ``PUT /admin/config`` at run time::

    {"version": "3f2a...", "require_key": true,
     "queue": {"max_queue": 64, "timeout_s": 60},
     "deployments": [{"name": "smollm2", "served_model_name": "smollm2-135m",
                      "router": "http://127.0.0.1:8080", "state": "running", "team": "default",
                      "require_key": true, "max_concurrency": 8}],
     "aliases": [{"name": "chat", "targets": ["smollm2", "other"]}],
     "keys": [{"id": 3, "prefix": "ab12cd34", "hash": "<sha256 hex>", "state": "active",
               "deployments": ["smollm2"], "team": "default", "priority": "normal",
               "priority_header": false}]}

``router`` is null while a deployment has no running router. A deployment's ``require_key``
(optional, the top-level value by default) false leaves it open, as its own router is: any
caller may use it, with a key or none. The top-level ``require_key`` true refuses every request
without a valid key. An alias's targets are deployment names in fallback order. Fields not
named here are ignored, so that the console may send more than this gateway reads.

A deployment's ``max_concurrency`` (optional, 0: none) is how many requests the gateway lets in
flight to it at once; past it they wait in the gateway's priority queues (flow_control.py),
bounded by ``queue``. A key's ``priority`` is its band (flow_control.BANDS) and its ``team`` its
fairness flow; ``priority_header`` true lets its requests choose a band up to its own and
their own flow with the X-Pdserve-Priority and X-Pdserve-Fairness-Id headers. Everything
is checked before anything is used: a configuration is taken whole or refused whole, with a
RequestError naming the offending field by its JSON path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yarl import URL

from inference.gateway.flow_control import BANDS, DEFAULT_BAND, DEFAULT_MAX_QUEUE, DEFAULT_QUEUE_TIMEOUT_S
from inference.router.errors import RequestError
from inference.router.keys import key_entry, load_console_file

KEY_STATES = ("active", "revoked")


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    served_model_name: str
    router: str | None  # base URL without a trailing slash; None: no router running
    state: str
    team: str
    require_key: bool = True
    max_concurrency: int = 0  # 0: no gateway queue


@dataclass(frozen=True, slots=True)
class Alias:
    name: str
    targets: tuple[str, ...]  # deployment names, in fallback order


@dataclass(frozen=True, slots=True)
class Key:
    id: str
    prefix: str
    hash: str  # lower-case SHA-256 hex of the whole key
    state: str
    deployments: frozenset[str]  # the names of the deployments the key may use
    team: str = ""  # the fairness flow of its requests; "" for the key's own flow
    priority: str = DEFAULT_BAND
    priority_header: bool = False  # may its requests choose their band and flow?


@dataclass(frozen=True, slots=True)
class QueueSettings:
    max_queue: int = DEFAULT_MAX_QUEUE  # requests waiting per deployment
    timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    version: str = ""
    require_key: bool = False
    deployments: tuple[Deployment, ...] = ()
    aliases: tuple[Alias, ...] = ()
    keys: tuple[Key, ...] = ()
    queue: QueueSettings = QueueSettings()


def parse_config(data: Any) -> GatewayConfig:
    """Validate a configuration; raises RequestError (400) naming the offending field."""
    if not isinstance(data, dict):
        raise RequestError(400, "the configuration must be a JSON object")
    version = data.get("version", "")
    if not isinstance(version, str):
        raise RequestError(400, "'version' must be a string", param="version")
    require_key = data.get("require_key", False)
    if not isinstance(require_key, bool):
        raise RequestError(400, "'require_key' must be a boolean", param="require_key")
    deployments = _deployments(_list(data, "deployments", required=True), require_key)
    names = {deployment.name for deployment in deployments}
    served = {deployment.served_model_name for deployment in deployments}
    aliases = _aliases(_list(data, "aliases"), names, served)
    keys = _keys(_list(data, "keys"), names)
    return GatewayConfig(version, require_key, deployments, aliases, keys, _queue(data.get("queue")))


def load_config_file(path: str | Path) -> GatewayConfig:
    """The configuration in ``path``; ValueError naming --config-file and what is wrong."""
    return load_console_file(path, "--config-file", parse_config)


def _list(data: dict[str, Any], name: str, required: bool = False) -> list[Any]:
    value = data.get(name)
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise RequestError(400, f"'{name}' must be a list", param=name)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(400, f"'{where}' must be an object", param=where)
    return value


def _name(entry: dict[str, Any], field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"'{where}.{field}' must be a non-empty string", param=f"{where}.{field}")
    return value


def _text(entry: dict[str, Any], field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str):
        raise RequestError(400, f"'{where}.{field}' must be a string", param=f"{where}.{field}")
    return value


def _router_url(value: Any, where: str) -> str | None:
    if value is None:
        return None
    param = f"{where}.router"
    if not isinstance(value, str):
        raise RequestError(400, f"'{param}' must be a URL or null", param=param)
    try:
        url = URL(value)
    except ValueError as exc:
        raise RequestError(400, f"'{param}' is not a URL: {exc}", param=param) from None
    # Request paths are appended to it as they come: a path, query or fragment of its own would
    # send them somewhere else than the router's /v1.
    if (url.scheme not in ("http", "https") or not url.host or url.path not in ("", "/")
            or url.query_string or url.fragment or url.user is not None):
        raise RequestError(400, f"'{param}' must be an http(s) base URL such as "
                                f"http://127.0.0.1:8080, not {value!r}", param=param)
    return value.rstrip("/")


def _deployments(entries: list[Any], require_key: bool) -> tuple[Deployment, ...]:
    deployments: list[Deployment] = []
    names: set[str] = set()
    for index, raw in enumerate(entries):
        where = f"deployments[{index}]"
        entry = _object(raw, where)
        name = _name(entry, "name", where)
        if name in names:
            raise RequestError(400, f"deployment name {name!r} appears twice", param=f"{where}.name")
        # Several deployments may serve one name (each team its own copy, or a second
        # deployment of a model): the name routes to all of them, in this order, each caller
        # reaching those its key opens.
        served_name = _name(entry, "served_model_name", where)
        if "router" not in entry:
            raise RequestError(400, f"'{where}.router' is required (null when no router runs)",
                               param=f"{where}.router")
        router = _router_url(entry["router"], where)
        closed = entry.get("require_key", require_key)
        if not isinstance(closed, bool):
            raise RequestError(400, f"'{where}.require_key' must be a boolean",
                               param=f"{where}.require_key")
        limit = entry.get("max_concurrency", 0)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 <= limit <= 1_000_000:
            raise RequestError(400, f"'{where}.max_concurrency' must be an integer from 0 (no "
                                    "gateway queue) to 1000000", param=f"{where}.max_concurrency")
        deployments.append(Deployment(name, served_name, router, _text(entry, "state", where),
                                      _text(entry, "team", where), closed, limit))
        names.add(name)
    return tuple(deployments)


def _aliases(entries: list[Any], names: set[str], served: set[str]) -> tuple[Alias, ...]:
    aliases: list[Alias] = []
    seen: set[str] = set()
    for index, raw in enumerate(entries):
        where = f"aliases[{index}]"
        entry = _object(raw, where)
        name = _name(entry, "name", where)
        if name in served:
            # Else one model name would mean two things: the deployment or the alias.
            raise RequestError(400, f"alias {name!r} is a deployment's served model name",
                               param=f"{where}.name")
        if name in seen:
            raise RequestError(400, f"alias {name!r} appears twice", param=f"{where}.name")
        targets = entry.get("targets")
        if not isinstance(targets, list) or not targets:
            raise RequestError(400, f"'{where}.targets' must be a non-empty list of deployment names",
                               param=f"{where}.targets")
        for position, target in enumerate(targets):
            param = f"{where}.targets[{position}]"
            if not isinstance(target, str) or target not in names:
                raise RequestError(400, f"'{param}': no deployment named {target!r}", param=param)
            if target in targets[:position]:
                raise RequestError(400, f"'{param}': {target!r} is a target already", param=param)
        aliases.append(Alias(name, tuple(targets)))
        seen.add(name)
    return tuple(aliases)


def _keys(entries: list[Any], names: set[str]) -> tuple[Key, ...]:
    keys: list[Key] = []
    prefixes: set[str] = set()
    for index, raw in enumerate(entries):
        where = f"keys[{index}]"
        entry = _object(raw, where)
        if "state" not in entry:
            raise RequestError(400, f"'{where}.state' must be one of {', '.join(KEY_STATES)}",
                               param=f"{where}.state")
        key_id, prefix, digest, state = key_entry(entry, where, KEY_STATES, prefixes)
        allowed = entry.get("deployments")
        if not isinstance(allowed, list):
            raise RequestError(400, f"'{where}.deployments' must be a list of deployment names",
                               param=f"{where}.deployments")
        for position, name in enumerate(allowed):
            if not isinstance(name, str) or name not in names:
                param = f"{where}.deployments[{position}]"
                raise RequestError(400, f"'{param}': no deployment named {name!r}", param=param)
        team = entry.get("team", "")
        if not isinstance(team, str):
            raise RequestError(400, f"'{where}.team' must be a string", param=f"{where}.team")
        priority = entry.get("priority", DEFAULT_BAND)
        if priority not in BANDS:
            raise RequestError(400, f"'{where}.priority' must be one of {', '.join(BANDS)}",
                               param=f"{where}.priority")
        header = entry.get("priority_header", False)
        if not isinstance(header, bool):
            raise RequestError(400, f"'{where}.priority_header' must be a boolean",
                               param=f"{where}.priority_header")
        keys.append(Key(key_id, prefix, digest, state, frozenset(allowed), team, priority, header))
        prefixes.add(prefix)
    return tuple(keys)


def _queue(value: Any) -> QueueSettings:
    if value is None:
        return QueueSettings()
    entry = _object(value, "queue")
    max_queue = entry.get("max_queue", DEFAULT_MAX_QUEUE)
    if not isinstance(max_queue, int) or isinstance(max_queue, bool) or not 0 <= max_queue <= 100_000:
        raise RequestError(400, "'queue.max_queue' must be an integer from 0 to 100000",
                           param="queue.max_queue")
    timeout = entry.get("timeout_s", DEFAULT_QUEUE_TIMEOUT_S)
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not 0 < timeout <= 3600):
        raise RequestError(400, "'queue.timeout_s' must be a number of seconds above 0, at most 3600",
                           param="queue.timeout_s")
    return QueueSettings(max_queue, float(timeout))
