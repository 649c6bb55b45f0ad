"""The gateway: one OpenAI endpoint for every deployment (``python -m inference.gateway``),
which the console's supervisor keeps running like a router, and the console's side of its admin
API (push the configuration, read its version).

It forwards each request to its deployment's own router, so every deployment keeps its
revisions, colours, degraded mode and prefill/decode pairing exactly as on its own port.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import sys
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

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


def url() -> str:
    """Where the console reaches the gateway (a wildcard bind is reached on loopback)."""
    address = host()
    if address in ("0.0.0.0", "::"):
        address = "127.0.0.1"
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{settings.PDSERVE_GATEWAY_PORT}"


def admin_token() -> str:
    # Derived from the secret key, as the routers' tokens are: nothing more to store or protect.
    return hmac.new(settings.SECRET_KEY.encode(), b"pdserve:gateway-admin",
                    hashlib.sha256).hexdigest()


def config_path() -> Path:
    return Path(settings.DATA_DIR) / "gateway" / "config.json"


def command() -> list[str]:
    return [sys.executable, "-m", "inference.gateway", "--host", host(), "--port",
            str(settings.PDSERVE_GATEWAY_PORT), "--config-file", str(config_path())]


def environment() -> dict[str, str]:
    """The admin token goes in the environment, never on the command line (ps shows that)."""
    return {ADMIN_TOKEN_ENV: admin_token()}


def write_config(config: dict[str, Any]) -> Path:
    """Where a starting gateway reads its configuration (it holds key hashes)."""
    return write_private(config_path(), json.dumps(config, sort_keys=True))


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token()}"}


def running_version() -> str:
    """The version of the configuration the gateway serves with (``GET /admin/config``).
    Raises ``AdminUnreadable`` when it gives no such answer."""
    try:
        response = httpx.get(f"{url()}/admin/config", headers=_headers(), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise AdminUnreadable(f"GET /admin/config: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise AdminUnreadable(f"GET /admin/config: {response.status_code} {response.text[:200]}")
    try:
        version = response.json()["version"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AdminUnreadable(f"GET /admin/config: not a configuration summary ({exc!r})") from exc
    if not isinstance(version, str):
        raise AdminUnreadable(f"GET /admin/config: version {version!r} is not a string")
    return version


def push_config(config: dict[str, Any]) -> Push:
    """PUT the configuration to the running gateway. One that did not take it is pushed to
    again by the supervisor's sync, which finds its version behind (console/gateway/sync.py)."""
    try:
        response = httpx.put(f"{url()}/admin/config", json=config, headers=_headers(),
                             timeout=TIMEOUT_S)
    except httpx.ConnectError:
        return Push.NO_ROUTER  # not listening (yet): it reads the file when it starts
    except httpx.HTTPError as exc:
        log.warning("gateway configuration push failed (%s: %s); the sync pushes again",
                    type(exc).__name__, exc)
        return Push.FAILED
    if response.status_code != 200:
        log.warning("gateway refused its configuration: %d %s", response.status_code,
                    response.text[:300])
        return Push.FAILED
    return Push.SENT
