"""Backend workers and the pools the router picks them from.

Each backend owns one pooled aiohttp session, so connections to a worker are reused across
requests. Health is both active (a probe of ``/health``) and passive (a connection error marks
the backend down at once, so the next request does not wait for the next probe).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass(eq=False)
class Backend:
    url: str
    role: str
    session: aiohttp.ClientSession | None = None
    healthy: bool = False
    in_flight: int = 0
    last_error: str = ""
    slow_probes: int = 0
    last_change: float = field(default_factory=time.monotonic)

    def mark(self, healthy: bool, error: str = "") -> None:
        if healthy != self.healthy:
            self.last_change = time.monotonic()
        self.healthy = healthy
        self.last_error = error

    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError(f"backend {self.url} used before the router started")
        return self.session


class NoBackendAvailable(Exception):
    def __init__(self, role: str, backends: list[Backend]):
        self.role = role
        detail = "; ".join(f"{b.url}: {b.last_error or 'not ready'}" for b in backends) or "none configured"
        super().__init__(f"no ready {role} worker ({detail})")


class Pool:
    """The backends of one role; picks a ready backend by least in-flight, then round robin."""

    def __init__(self, role: str, urls: tuple[str, ...]):
        self.role = role
        self.backends = [Backend(url=url, role=role) for url in urls]
        self._turn = itertools.count()

    def ready(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    def pick(self) -> Backend:
        ready = self.ready()
        if not ready:
            raise NoBackendAvailable(self.role, self.backends)
        fewest = min(b.in_flight for b in ready)
        candidates = [b for b in ready if b.in_flight == fewest]
        return candidates[next(self._turn) % len(candidates)]


async def open_sessions(pools: list[Pool], connect_timeout_s: float) -> None:
    for pool in pools:
        for backend in pool.backends:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=30)
            backend.session = aiohttp.ClientSession(
                base_url=backend.url,
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
                auto_decompress=False,
            )


async def close_sessions(pools: list[Pool]) -> None:
    for pool in pools:
        for backend in pool.backends:
            if backend.session is not None:
                await backend.session.close()


# A busy worker (say, a long prefill on a saturated core) can miss a probe's deadline while it
# is perfectly able to serve; only this many slow probes in a row take it out. A refused
# connection or an error status is no such doubt and takes it out at once.
SLOW_PROBES_TO_FAIL = 3


async def probe(backend: Backend, timeout_s: float) -> None:
    try:
        async with backend.client().get(
            "/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            ok = response.status == 200
            backend.slow_probes = 0
            backend.mark(ok, "" if ok else f"/health {response.status}")
    except TimeoutError:
        backend.slow_probes += 1
        if backend.slow_probes >= SLOW_PROBES_TO_FAIL or not backend.healthy:
            backend.mark(False, f"/health timed out {backend.slow_probes} times in a row")
    except aiohttp.ClientError as exc:
        backend.slow_probes = 0
        backend.mark(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def probe_forever(pools: list[Pool], interval_s: float) -> None:
    while True:
        await asyncio.gather(
            *(probe(b, timeout_s=max(interval_s, 0.5)) for pool in pools for b in pool.backends)
        )
        await asyncio.sleep(interval_s)
