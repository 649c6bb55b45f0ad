"""What the admin API reads and answers, shared by its pool and group endpoints: worker URLs,
backend descriptions, and errors in OpenAI's shape with ``param`` naming the field."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from yarl import URL

from inference.router.backends import Backend
from inference.router.prompts import RequestError


def backend_url(value: Any, param: str = "url") -> str:
    """A worker's base URL as the router stores it: http(s)://host[:port], no trailing slash.
    A bad one raises RequestError naming ``param``."""
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"'{param}' is required: a worker's base URL such as "
                                "http://127.0.0.1:8100", param=param)
    try:
        url = URL(value)
        port = url.port
    except ValueError as exc:
        raise RequestError(400, f"'{param}' is not a valid URL: {exc}", param=param) from exc
    if url.scheme not in ("http", "https") or not url.host or not port:
        raise RequestError(400, f"'{param}' must be http(s)://host[:port], got {value!r}",
                           param=param)
    if url.path not in ("", "/") or url.query_string or url.fragment or url.user or url.password:
        raise RequestError(400, f"'{param}' must be a base URL without path, query or credentials, "
                                f"got {value!r}", param=param)
    return value.rstrip("/")


def describe(backend: Backend) -> dict[str, Any]:
    state = "draining" if backend.draining else "ready" if backend.healthy else "not_ready"
    return {"role": backend.role, "url": backend.url, "state": state,
            "in_flight": backend.in_flight, "error": backend.last_error}


def error(status: int, message: str, param: str | None = None,
          code: str | None = None) -> web.Response:
    return web.json_response(RequestError(status, message, param=param, code=code).body(),
                             status=status)
