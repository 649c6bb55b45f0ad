"""Backend workers and the pools the router picks them from.

Each backend owns one pooled aiohttp session, so connections to a worker are reused across
requests. Health is both active (a probe of ``/health``) and passive (a connection error marks
the backend down at once, so the next request does not wait for the next probe).

Pools change at run time (the admin API): a removed backend leaves the pool at once, so no new
request picks it, and is *drained*: its session stays open until its last in-flight request has
finished, then closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp

from inference.health_rule import ProbeRule
from inference.router.policies import Choice, LeastOutstanding, Policy
from inference.worker_auth import bearer

log = logging.getLogger("pdserve.router.backends")


@dataclass(frozen=True)
class Breaker:
    """The circuit breaker of a pool's backends: ``failures`` failed calls in a row (5xx
    answers, refused or broken connections; never timeouts, which are the probe's business) take
    a backend out for ``cooldown_s`` even while its /health passes; then its probe decides, and
    one more failure opens the breaker again. ``on_open`` is told each opening."""

    failures: int = 5
    cooldown_s: float = 10.0
    on_open: Callable[[Backend], None] | None = None


@dataclass(eq=False)
class Backend:
    url: str
    role: str
    session: aiohttp.ClientSession | None = None
    healthy: bool = False
    in_flight: int = 0
    last_error: str = ""
    # Its probes' recent latencies and slow probes in a row (inference/health_rule.py).
    probes: ProbeRule = field(default_factory=ProbeRule, repr=False)
    last_change: float = field(default_factory=time.monotonic)
    # Removed from its pool; finishing the requests it already has.
    draining: bool = False
    # Circuit breaker: its rule, failed calls in a row, and until when it keeps the backend out.
    breaker: Breaker = field(default_factory=Breaker, repr=False)
    failures: int = 0
    open_until: float = 0.0
    # KV this backend prefilled and announced to a decode call that has not yet started
    # answering: closing it now would leave decode nothing to pull (see KvLease).
    kv_pending: int = 0
    # The workers' key (inference/worker_auth.py), sent with every call of its session.
    worker_key: str | None = field(default=None, repr=False)
    # Set while a drain waits, so that it wakes when in_flight or kv_pending falls.
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def mark(self, healthy: bool, error: str = "") -> None:
        if healthy != self.healthy:
            self.last_change = time.monotonic()
            # Each change, with its reason: a worker that leaves rotation under load (missed
            # probes) and the warm-up redone on its return are otherwise invisible in the log.
            if healthy:
                log.info("%s %s in rotation", self.role, self.url)
            else:
                log.warning("%s %s out of rotation: %s", self.role, self.url, error or "not ready")
        self.healthy = healthy
        self.last_error = error

    @property
    def slow_probes(self) -> int:
        return self.probes.slow

    def call_failed(self) -> None:
        """Count a failed call (not a timeout); at the breaker's count in a row it opens: the
        backend is out for its cool-down, whatever its health probe says."""
        breaker = self.breaker
        self.failures += 1
        if self.failures < breaker.failures or time.monotonic() < self.open_until:
            return
        self.open_until = time.monotonic() + breaker.cooldown_s
        reason = (f"circuit open: {self.failures} failed calls in a row; probed again after "
                  f"{breaker.cooldown_s:g} s")
        if not self.healthy:
            # Already out (a refused connection marked it): mark() logs changes only.
            log.warning("%s %s: %s", self.role, self.url, reason)
        self.mark(False, reason)
        if breaker.on_open is not None:
            breaker.on_open(self)

    def call_succeeded(self) -> None:
        self.failures = 0

    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError(f"backend {self.url} used before the router started")
        return self.session

    def open(self, connect_timeout_s: float) -> None:
        # Idle connections are dropped before vLLM's server closes them (after 5 s,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE): reusing one it is closing fails a request for nothing.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, keepalive_timeout=4)
        self.session = aiohttp.ClientSession(
            base_url=self.url,
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
            # Answers are relayed as they come; asking for no compression keeps the bytes and
            # the Content-Type the router passes on consistent.
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
            # Workers set no cookies; a real jar is consulted twice per request for nothing.
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=bearer(self.worker_key),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    # Callers take a backend from Pool.pick and acquire it with no await in between, so a
    # drain that starts meanwhile always sees the request in in_flight.
    def acquire(self) -> None:
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        self._notify()

    def lease_kv(self) -> KvLease:
        """Count KV this (prefill) backend holds for a decode call until the lease is released."""
        self.kv_pending += 1
        return KvLease(self)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def drain(self, kv_lease_s: float) -> None:
        """Wait for the in-flight requests to finish and for decode to start on the KV this
        backend announced (at most ``kv_lease_s`` from now: by then the worker has freed
        unpulled blocks itself), then close the session."""
        self.draining = True
        kv_deadline = time.monotonic() + kv_lease_s
        while True:
            kv_left_s = kv_deadline - time.monotonic()
            if not self.in_flight and (not self.kv_pending or kv_left_s <= 0):
                break
            self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(),
                                       kv_left_s if self.kv_pending and kv_left_s > 0 else None)
            except TimeoutError:
                log.warning("%s %s: KV lease of %g s over with %d hand-offs never pulled",
                            self.role, self.url, kv_lease_s, self.kv_pending)
        self._changed = None
        await self.close()


class KvLease:
    """A prefill backend's KV that one decode call is to pull. Released (once, whatever path the
    request takes) when decode has started answering or the call has ended."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.backend.kv_pending -= 1
            self.backend._notify()


class NoBackendAvailable(Exception):
    def __init__(self, role: str, backends: Sequence[Backend]):
        self.role = role
        detail = "; ".join(f"{b.url}: {b.last_error or 'not ready'}" for b in backends) or "none configured"
        super().__init__(f"no ready {role} worker ({detail})")


class Pool:
    """The backends of one role; its policy (least_outstanding unless given) picks among the
    ready ones."""

    def __init__(self, role: str, urls: tuple[str, ...], policy: Policy | None = None,
                 worker_key: str | None = None, breaker: Breaker | None = None):
        self.role = role
        self.policy = policy or LeastOutstanding()
        self.worker_key = worker_key
        self.breaker = breaker or Breaker()
        self.backends = [Backend(url=url, role=role, worker_key=worker_key, breaker=self.breaker)
                         for url in urls]
        self.draining: list[Backend] = []

    def ready(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    def pick(self, prompt_token_ids: Sequence[int] = (), exclude: Backend | None = None,
             only: Callable[[Backend], bool] | None = None) -> Choice:
        """The policy's choice among the ready backends other than ``exclude`` (a backend that
        just failed this request) and, if given, those ``only`` accepts."""
        ready = [b for b in self.backends
                 if b.healthy and b is not exclude and (only is None or only(b))]
        if not ready:
            others = [b for b in self.backends if b is not exclude]
            raise NoBackendAvailable(self.role, others)
        return self.policy.choose(ready, prompt_token_ids)

    def find(self, url: str) -> Backend | None:
        return next((b for b in self.backends if b.url == url), None)

    def add(self, url: str) -> Backend:
        if self.find(url) is not None:
            raise ValueError(f"{url} is already a {self.role} backend")
        backend = Backend(url=url, role=self.role, worker_key=self.worker_key,
                          breaker=self.breaker)
        self.backends.append(backend)
        return backend

    def remove(self, backend: Backend) -> None:
        """Take ``backend`` out of rotation; the caller drains it."""
        self.backends.remove(backend)
        backend.draining = True
        self.draining.append(backend)


async def open_sessions(pools: Iterable[Pool], connect_timeout_s: float) -> None:
    for pool in pools:
        for backend in pool.backends:
            backend.open(connect_timeout_s)


async def close_sessions(pools: Iterable[Pool]) -> None:
    for pool in pools:
        for backend in [*pool.backends, *pool.draining]:
            await backend.close()


# A busy worker (say, a long prefill on a saturated core) can miss a probe's deadline while it
# is perfectly able to serve; only slow probes in a row take it out: two, or three for a worker
# whose recent probes were slow (measured load, see inference/health_rule.py). A refused
# connection or an error status is no such doubt and takes it out at once. With probes at a
# fixed rate (see probe_forever) an idle frozen worker (SIGSTOP, a hung host) is out within 3
# probe intervals, under 3 s at the default 1 s.
# A probe's base deadline, as a share of the interval: a timed-out probe still leaves time before
# the next one starts. A frozen worker is out 1.6-2.6 s after it froze at the default interval
# (3.1 s was measured with 0.8 on a machine at load 13). A worker whose recent answers were slow
# gets up to PROBE_TIMEOUT_CAP times that.
PROBE_TIMEOUT_SHARE = 0.6
PROBE_TIMEOUT_CAP = 3.0


# A probe whose timeout fired this much later than its deadline says nothing about the worker:
# the router's own event loop was held up (a long synchronous step, or the router's process
# starved of CPU), so the answer may have been waiting. Seen on 2 cores with two NIXL workers
# busy-polling: prefill and decode "timed out" in the same millisecond and the prefill answered
# its next probe 7 ms later.
PROBE_LATE_S = 0.25


async def probe(backend: Backend, timeout_s: float) -> None:
    """One /health probe of ``backend``; ``timeout_s`` is the base deadline, which a worker
    measured busy gets more of (ProbeRule)."""
    if backend.draining or time.monotonic() < backend.open_until:
        # A removed backend's health no longer matters (its session may be closed by now); an
        # open breaker keeps its backend out until the cool-down ends, then the probe decides
        # (half-open: one more failed call opens it again).
        return
    rule = backend.probes
    deadline_s = rule.timeout_s(timeout_s, PROBE_TIMEOUT_CAP * timeout_s)
    started = time.monotonic()
    try:
        async with backend.client().get(
            "/health", timeout=aiohttp.ClientTimeout(total=deadline_s)
        ) as response:
            ok = response.status == 200
            rule.answered(time.monotonic() - started)
            backend.mark(ok, "" if ok else f"/health {response.status}")
    except TimeoutError:
        late_s = time.monotonic() - started - deadline_s
        if late_s > PROBE_LATE_S:
            log.info("%s %s: /health probe inconclusive, the router itself was %.1f s late",
                     backend.role, backend.url, late_s)
            return
        if rule.timed_out(timeout_s) or not backend.healthy:
            backend.mark(False, f"/health timed out {rule.slow} times in a row "
                                f"(last deadline {deadline_s:.1f} s)")
    except aiohttp.ClientError as exc:
        # Refused or reset: the process is not there (or not serving); out at once.
        rule.refused()
        backend.mark(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


async def probe_forever(pools: Callable[[], Iterable[Pool]], interval_s: float) -> None:
    """Probe every backend once per ``interval_s``, each on its own: a slow probe of one worker
    (whose deadline may exceed the interval when it is busy) delays no other's, so a worker
    that dies is still seen at its next probe, within the interval."""
    timeout_s = max(interval_s * PROBE_TIMEOUT_SHARE, 0.5)
    running: dict[Backend, asyncio.Task[None]] = {}
    try:
        while True:
            started = time.monotonic()
            # The pools and their members are read afresh each round: the admin API changes
            # both at run time (groups and backends).
            members = [b for pool in pools() for b in pool.backends]
            for backend in members:
                task = running.get(backend)
                if task is None or task.done():
                    running[backend] = asyncio.create_task(probe(backend, timeout_s=timeout_s))
            for backend in [b for b, t in running.items() if t.done() and b not in members]:
                del running[backend]
            # Rounds start every interval, however long a probe takes: a probe waiting out a
            # hung worker's deadline must not delay the next look at the others.
            await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        for task in running.values():
            task.cancel()
