"""The console's side of a router's admin API: the token it is started with, the console's own
inference key, and the calls that push key sets and read key usage."""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

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


def admin_url(deployment: Deployment) -> str:
    host = deployment.router_host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{deployment.router_port}/admin"


def _headers(deployment: Deployment) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token(deployment)}"}


def push_keys(deployment: Deployment, key_set: dict[str, Any]) -> bool:
    """PUT the key set to the deployment's router. False when it is not running or refuses;
    the supervisor's key sync pushes again once it answers (console/gateway/sync.py)."""
    if not deployment.processes.filter(role="router", pid__isnull=False).exists():
        return False
    try:
        response = httpx.put(f"{admin_url(deployment)}/keys", json=key_set,
                             headers=_headers(deployment), timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.info("key push to %s: router not reachable (%s)", deployment.name, exc)
        return False
    if response.status_code != 200:
        log.warning("key push to %s refused: %d %s", deployment.name, response.status_code,
                    response.text[:300])
        return False
    return True


def fetch_usage(deployment: Deployment) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{admin_url(deployment)}/keys/usage", headers=_headers(deployment),
                             timeout=TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    data = response.json()
    return data if isinstance(data, dict) else None
