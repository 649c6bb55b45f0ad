"""A worker's key: every vLLM worker refuses callers without it, on every path but ``/health``.

vLLM's own ``--api-key`` (and ``VLLM_API_KEY``) guards only ``/v1``, ``/v2``, ``/inference``
and ``/cohere`` (vllm/entrypoints/serve/middleware/authenticate.py, 0.32): ``/tokenize``,
``/detokenize``, ``/metrics``, ``/pooling``, ``/score``, ``/load``, ``/version`` and the rest
stay open. So every worker also loads :class:`WorkerKeyMiddleware` (vLLM's ``--middleware``
flag), which guards every path except ``/health`` (the supervisor's and the router's probes).
Both read the key from the worker's environment (``VLLM_API_KEY``), never from argv, which
shows in ``ps``, in the log header and in the process table.

The key is derived per deployment (and per requested server) from the console's secret key,
as the router's admin token is: :func:`derive_key`. Every caller sends it as
``Authorization: Bearer <key>``: the router's sessions, the collector's scrapes, the output
gate, the measurements.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

import httpx

# vLLM's own variable: its middleware guards /v1 with it, ours everything else.
WORKER_KEY_ENV = "VLLM_API_KEY"
# The router's: the key it sends to its deployment's workers.
ROUTER_WORKER_KEY_ENV = "PDSERVE_WORKER_KEY"
MIDDLEWARE = "inference.worker_auth.WorkerKeyMiddleware"
# Paths answered without the key: liveness only, which tells nothing about the model.
OPEN_PATHS = frozenset({"/health"})


def derive_key(secret: str, purpose: str, name: str) -> str:
    """The key of ``name`` (a deployment, or a requested server's slot) for ``purpose``."""
    message = f"pdserve:{purpose}:{name}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def bearer(key: str | None) -> dict[str, str]:
    """The header that carries ``key`` (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class WorkerKeyMiddleware:
    """Pure ASGI middleware: a request without ``Authorization: Bearer <VLLM_API_KEY>`` gets
    401 on every path but ``/health``. Without the variable set it lets everything through
    (a worker started by hand, as vLLM does without ``--api-key``)."""

    def __init__(self, app: App) -> None:
        self.app = app
        key = os.environ.get(WORKER_KEY_ENV) or ""
        self.digest = hashlib.sha256(key.encode()).digest() if key else None

    def allowed(self, scope: Scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if self.digest is None or path in OPEN_PATHS:
            return True
        supplied = b""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                supplied = value
                break
        scheme, _, token = supplied.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.strip()).digest(), self.digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": {"message": "missing or invalid worker key",
                                     "type": "unauthorized", "code": 401}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class WorkerKeys(httpx.Auth):
    """httpx auth that sends each worker its own key, chosen by the request's origin
    (``http://host:port``); requests elsewhere go without one."""

    def __init__(self, keys: Mapping[str, str | None]) -> None:
        self.keys = {_origin(httpx.URL(url)): key for url, key in keys.items() if key}

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        key = self.keys.get(_origin(request.url))
        if key:
            request.headers["Authorization"] = f"Bearer {key}"
        yield request


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode()}"
