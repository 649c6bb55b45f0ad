"""The gateway: one OpenAI endpoint for every deployment (``python -m inference.gateway``),
which the console's supervisor keeps running like a router, and the console's side of its admin
API (push the configuration, read its version).

It forwards each request to its deployment's own router, so every deployment keeps its
revisions, colours, degraded mode and prefill/decode pairing exactly as on its own port.

``PDSERVE_GATEWAY_REPLICAS`` processes run, replica ``i`` on ``PDSERVE_GATEWAY_PORT + i`` under
the slot ``gateway`` (the first: the slot a single gateway always had, so an upgraded supervisor
adopts it) or ``gateway-<i>``. They share one configuration file: what a replica needs of the
others is held by the routers behind them (limits, budgets, pinning, usage).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from console.gateway.private_files import write_private
from console.gateway.router_admin import AdminUnreadable, Push

log = logging.getLogger("pdserve.gateway")

SLOT = "gateway"
ROLE = "gateway"
ADMIN_TOKEN_ENV = "PDSERVE_GATEWAY_ADMIN_TOKEN"
TIMEOUT_S = 2.0


def enabled() -> bool:
    """``PDSERVE_GATEWAY_PORT=0`` turns the gateway off (each deployment's port still serves)."""
    return settings.PDSERVE_GATEWAY_PORT != 0


def host() -> str:
    # Checked here, where it reaches a command line: an address, never anything else.
    return str(ipaddress.ip_address(settings.PDSERVE_GATEWAY_HOST))


def replicas() -> range:
    return range(settings.PDSERVE_GATEWAY_REPLICAS)


def slot(replica: int) -> str:
    return SLOT if replica == 0 else f"{SLOT}-{replica}"


def port(replica: int) -> int:
    # Checked here too: tests and `up` set the port after settings.py checked it.
    number = settings.PDSERVE_GATEWAY_PORT + replica
    if not 1 <= number <= 65535:
        raise ImproperlyConfigured(
            f"PDSERVE_GATEWAY_PORT / PDSERVE_GATEWAY_REPLICAS: replica {replica} would listen on "
            f"port {number}, outside 1-65535")
    return number


def url(replica: int = 0) -> str:
    """Where the console reaches a replica (a wildcard bind is reached on loopback)."""
    address = host()
    if address in ("0.0.0.0", "::"):
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port(replica)}"


def urls() -> Iterator[str]:
    return (url(replica) for replica in replicas())


def admin_token() -> str:
    # Derived from the secret key, as the routers' tokens are: nothing more to store or protect.
    return hmac.new(settings.SECRET_KEY.encode(), b"pdserve:gateway-admin",
                    hashlib.sha256).hexdigest()


def config_path() -> Path:
    return Path(settings.DATA_DIR) / "gateway" / "config.json"


def gateway_argv(python: str, address: str, listen_port: int, config_file: str) -> list[str]:
    """The gateway's command line; the Kubernetes export gives it a pod's values."""
    return [python, "-m", "inference.gateway", "--host", address, "--port", str(listen_port),
            "--config-file", config_file]


def command(replica: int = 0) -> list[str]:
    return gateway_argv(sys.executable, host(), port(replica), str(config_path()))


def environment() -> dict[str, str]:
    """The admin token goes in the environment, never on the command line (ps shows that)."""
    return {ADMIN_TOKEN_ENV: admin_token()}


def write_config(config: dict[str, Any]) -> Path:
    """Where a starting gateway reads its configuration (it holds key hashes)."""
    return write_private(config_path(), json.dumps(config, sort_keys=True))


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token()}"}


def admin_get(replica: int, path: str) -> Any:
    """A replica's admin API answer to ``GET path``, parsed; raises ``AdminUnreadable`` when it
    cannot be reached, answers other than 200 or not JSON."""
    try:
        response = httpx.get(f"{url(replica)}{path}", headers=_headers(), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise AdminUnreadable(f"GET {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise AdminUnreadable(f"GET {path}: {response.status_code} {response.text[:200]}")
    try:
        return response.json()
    except ValueError as exc:
        raise AdminUnreadable(f"GET {path}: not JSON ({exc!r})") from exc


def running_version(replica: int = 0) -> str:
    """The version of the configuration a replica serves with (``GET /admin/config``).
    Raises ``AdminUnreadable`` when it gives no such answer."""
    body = admin_get(replica, "/admin/config")
    try:
        version = body["version"]
    except (KeyError, TypeError) as exc:
        raise AdminUnreadable(f"GET /admin/config: not a configuration summary ({exc!r})") from exc
    if not isinstance(version, str):
        raise AdminUnreadable(f"GET /admin/config: version {version!r} is not a string")
    return version


def push_config(config: dict[str, Any], replica: int = 0) -> Push:
    """PUT the configuration to a running replica. One that did not take it is pushed to again
    by the supervisor's sync, which finds its version behind (console/gateway/sync.py)."""
    try:
        response = httpx.put(f"{url(replica)}/admin/config", json=config, headers=_headers(),
                             timeout=TIMEOUT_S)
    except httpx.ConnectError:
        return Push.NO_ROUTER  # not listening (yet): it reads the file when it starts
    except httpx.HTTPError as exc:
        log.warning("gateway %s: configuration push failed (%s: %s); the sync pushes again",
                    slot(replica), type(exc).__name__, exc)
        return Push.FAILED
    if response.status_code != 200:
        log.warning("gateway %s refused its configuration: %d %s", slot(replica),
                    response.status_code, response.text[:300])
        return Push.FAILED
    return Push.SENT


def push_config_everywhere(config: dict[str, Any]) -> None:
    """Every replica, each on its own: one that is down takes the file when it starts."""
    for replica in replicas():
        push_config(config, replica)
