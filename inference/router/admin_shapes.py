"""What the admin API reads and answers, shared by its pool and group endpoints: worker URLs
and backend descriptions."""

from __future__ import annotations

from typing import Any, Protocol

from yarl import URL

from inference.router.backends import Backend
from inference.router.errors import RequestError
from inference.router.groups import Group
from inference.router.selection import Selector


class RouterControl(Protocol):
    """What the admin API reads and changes of the router's groups and workers
    (registry.Registry), named here so that the modules read one way: the server builds the
    admin API, never the reverse."""

    groups: dict[str, Group]
    selector: Selector

    @property
    def primary(self) -> Group: ...

    async def add_group(self, revision: str, mode: str, urls: dict[str, tuple[str, ...]],
                        weight: int) -> Group: ...

    def set_weights(self, weights: dict[str, int]) -> None: ...

    def remove_group(self, revision: str) -> Group: ...

    async def add_backend(self, role: str, url: str, group: Group | None = None) -> Backend: ...

    def remove_backend(self, role: str, url: str, group: Group | None = None) -> Backend: ...


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
