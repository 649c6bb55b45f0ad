"""The console's side of a router's admin API: the token it is started with, the console's own
inference key, and the calls that push key sets and read key usage and the usage ledger.

A router that runs but gives no usable answer (timeout, refused connection, error status, a
body of another shape) is *unreadable*: what it would have said is unknown, which is neither
"nothing" nor "done". Reads raise ``AdminUnreadable`` for it, so no caller can take it for an
empty answer; callers keep what they know and ask again later.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import urlencode

import httpx
from django.conf import settings

from console.deployments.models import Deployment
from inference.router.keys import KEY_PREFIX

log = logging.getLogger("pdserve.gateway")

TIMEOUT_S = 2.0
# Not hex, so no drawn key prefix can equal it.
CONSOLE_KEY_PREFIX = "console0"


def _derive(purpose: str, deployment: Deployment) -> str:
    # Derived from the secret key rather than stored: the console and the supervisor compute
    # the same value, and nothing more needs protecting than the secret key already does.
    message = f"pdserve:{purpose}:{deployment.name}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def admin_token(deployment: Deployment) -> str:
    """``PDSERVE_ROUTER_ADMIN_TOKEN`` of the deployment's router (passed in its environment)."""
    return _derive("router-admin", deployment)


def console_key(deployment: Deployment) -> str:
    """The inference key the console itself uses (the playground); no limits."""
    return f"{KEY_PREFIX}{CONSOLE_KEY_PREFIX}_{_derive('console-key', deployment)}"


def router_address(deployment: Deployment) -> str:
    """Where the console (and the gateway, on the same node) reaches the router: a wildcard
    bind on loopback."""
    host = deployment.router_host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{deployment.router_port}"


def admin_url(deployment: Deployment) -> str:
    return f"{router_address(deployment)}/admin"


def admin_headers(deployment: Deployment) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token(deployment)}"}


class AdminUnreadable(Exception):
    """The deployment's router gave no usable answer to an admin call; its state is unknown."""


def router_running(deployment: Deployment) -> bool:
    """Whether the deployment has a router process (started and not yet reaped). Without one
    there is no admin API to ask, and no request that a router holds."""
    return deployment.processes.filter(role="router", pid__isnull=False).exists()


def admin_get(deployment: Deployment, path: str, timeout_s: float = TIMEOUT_S) -> Any:
    """The JSON body of ``GET /admin<path>`` on the deployment's router. Raises
    ``AdminUnreadable`` for anything but a 200 with a JSON body."""
    try:
        response = httpx.get(f"{admin_url(deployment)}{path}", headers=admin_headers(deployment),
                             timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise AdminUnreadable(f"GET /admin{path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise AdminUnreadable(f"GET /admin{path}: {response.status_code} {response.text[:200]}")
    try:
        return response.json()
    except ValueError as exc:
        raise AdminUnreadable(f"GET /admin{path}: not JSON ({exc})") from exc


@dataclass(frozen=True)
class Member:
    """One backend in the router's pools: its role, url, revision group and state ("ready",
    "not_ready", "draining")."""

    role: str
    url: str
    revision: str
    state: str


def pool_members(deployment: Deployment, timeout_s: float = TIMEOUT_S) -> list[Member]:
    """Every backend of the router's pools (``GET /admin/backends``). Raises
    ``AdminUnreadable`` when the router gives no such list."""
    data = admin_get(deployment, "/backends", timeout_s=timeout_s)
    try:
        return [Member(role, backend["url"], backend.get("revision", ""), backend["state"])
                for role, pool in data["roles"].items() for backend in pool["backends"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise AdminUnreadable(f"GET /admin/backends: not a pool listing ({exc!r})") from exc


class Push(enum.Enum):
    SENT = "sent"            # the router has the set now
    NO_ROUTER = "no router"  # none runs; one that starts reads the key file
    FAILED = "failed"        # it runs but did not take the set (logged); the key sync pushes again


def push_keys(deployment: Deployment, key_set: dict[str, Any]) -> Push:
    """PUT the key set to the deployment's router. A router that did not take it is pushed to
    again by the supervisor's key sync, which finds its version behind (console/gateway/sync.py)."""
    if not router_running(deployment):
        return Push.NO_ROUTER
    try:
        response = httpx.put(f"{admin_url(deployment)}/keys", json=key_set,
                             headers=admin_headers(deployment), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.warning("key push to %s failed (%s: %s); the key sync pushes again", deployment.name,
                    type(exc).__name__, exc)
        return Push.FAILED
    if response.status_code != 200:
        log.warning("key push to %s refused: %d %s", deployment.name, response.status_code,
                    response.text[:300])
        return Push.FAILED
    return Push.SENT


def fetch_usage(deployment: Deployment) -> dict[str, Any]:
    """The router's ``GET /admin/keys/usage``: ``{"version": ..., "keys": {id: {...}}}``.
    Raises ``AdminUnreadable`` when it gives no such answer: its usage is then unknown, which
    must not be taken for "no use"."""
    data = admin_get(deployment, "/keys/usage")
    if not (isinstance(data, dict) and isinstance(data.get("version"), str)
            and isinstance(data.get("keys"), dict)):
        raise AdminUnreadable(f"GET /admin/keys/usage: not a usage answer: {str(data)[:200]}")
    return data


LEDGER_VERSION = 1
LEDGER_COUNTS = ("requests", "errors", "prompt_tokens", "completion_tokens")


@dataclass(frozen=True)
class LedgerRow:
    """One row of a router's usage ledger: its totals for one UTC day and key id ("" without a
    key), cumulative since the ledger file was made."""

    day: date
    key: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms_sum: float


def _ledger_row(row: Any) -> LedgerRow:
    """``row`` read as a ledger row; ValueError, TypeError or KeyError when it is none."""
    counts = {name: row[name] for name in LEDGER_COUNTS}
    # bool is an int to Python, and a count of True is no count.
    if any(type(value) is not int or value < 0 for value in counts.values()):
        raise ValueError(f"counts must be integers >= 0: {counts}")
    latency = row["latency_ms_sum"]
    if type(latency) not in (int, float) or not 0 <= latency < float("inf"):
        raise ValueError(f"latency_ms_sum must be a number >= 0: {latency!r}")
    if not isinstance(row["key"], str) or not isinstance(row["day"], str):
        raise TypeError("day and key must be strings")
    return LedgerRow(day=date.fromisoformat(row["day"]), key=row["key"],
                     latency_ms_sum=float(latency), **counts)


def fetch_usage_ledger(deployment: Deployment, since: date | None = None) -> list[LedgerRow]:
    """The router's ``GET /admin/usage[?since=YYYY-MM-DD]``: its usage ledger, per UTC day and
    key. Raises ``AdminUnreadable`` when it gives no such answer (a router without the
    endpoint, a malformed row): its usage is then unknown, which must not be taken for none."""
    path = "/usage" + (f"?{urlencode({'since': since.isoformat()})}" if since else "")
    data = admin_get(deployment, path)
    if not (isinstance(data, dict) and type(data.get("version")) is int
            and data["version"] == LEDGER_VERSION and isinstance(data.get("rows"), list)):
        raise AdminUnreadable(f"GET /admin{path}: not a usage ledger: {str(data)[:200]}")
    try:
        return [_ledger_row(row) for row in data["rows"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise AdminUnreadable(f"GET /admin{path}: not a usage ledger row ({exc!r})") from exc
