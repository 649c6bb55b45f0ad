"""``pd_adaptive``: where each request's prompt is prefilled.

A naive PD proxy sends every prompt through prefill, first come first served. On a small
machine that makes a 64-token prompt wait behind 1,024-token ones, and leaves the prefill
worker idle when the load is all decode (see README, "Adaptive disaggregation"). Per request,
this module chooses one of:

``local``
    Send the request straight to a decode worker, which computes the prompt itself (a KV
    consumer does when no KV is offered). Cheap for a short prompt, but it pauses that
    worker's running streams for as long as the prompt takes, so only prompts whose
    measured prefill time fits the stall budget go this way.
``remote``
    Prefill on a prefill worker, then decode with the KV hand-off. Long prompts wait in a
    queue for a free prefill slot, highest response ratio next: shortest first, with the
    waiting time aging every request so that long prompts still progress.
``prefill_whole``
    A short request run start to end on a prefill worker that has had no prefill work for a
    while, so its core helps with decode-only load. Never while prompts are queued or being
    prefilled: a prefill there would stall these streams.

The length threshold is derived from measured prefill speed (tokens per second of the
prefills the router sees), never fixed; until there is a measurement, only prompts within
one KV block (which a KV channel cannot move anyway) go local.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.router.backends import Backend

PLACEMENTS = ("local", "remote", "prefill_whole")


@dataclass(frozen=True, slots=True)
class Placement:
    where: str  # one of PLACEMENTS
    reason: str


class Speed:
    """Tokens per second, an exponentially weighted mean of observations."""

    def __init__(self, weight: float = 0.2):
        self.weight = weight
        self.tokens_per_s: float | None = None
        self.samples = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        self.samples += 1
        self.tokens_per_s = rate if self.tokens_per_s is None else (
            self.weight * rate + (1 - self.weight) * self.tokens_per_s)


class BusyWindow:
    """The fraction of the last ``window_s`` seconds during which any remote prefill ran."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self._spans: deque[tuple[float, float]] = deque()
        self._open = 0
        self._open_since = 0.0

    def start(self) -> None:
        if self._open == 0:
            self._open_since = self._clock()
        self._open += 1

    def stop(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._spans.append((self._open_since, self._clock()))

    def fraction(self) -> float:
        now = self._clock()
        horizon = now - self.window_s
        while self._spans and self._spans[0][1] < horizon:
            self._spans.popleft()
        busy = sum(end - max(start, horizon) for start, end in self._spans)
        if self._open:
            busy += now - max(self._open_since, horizon)
        return min(1.0, busy / self.window_s)


@dataclass(eq=False)
class _Waiter:
    tokens: int
    service_s: float
    arrived: float
    future: asyncio.Future[Backend] = field(repr=False)

    def response_ratio(self, now: float) -> float:
        return (now - self.arrived + self.service_s) / self.service_s


class PrefillQueue:
    """Remote prefills take one of ``slots`` per prefill worker; the rest wait here.

    On CPU a worker runs one prefill at a time anyway (several in one batch take as long as
    one after the other), so holding them here costs nothing and lets the router choose the
    order: highest response ratio (wait + service) / service next.
    """

    RECHECK_S = 0.25  # a waiter looks again this often, for workers that became ready

    def __init__(self, slots: int, clock: Callable[[], float] = time.monotonic):
        self.slots = slots
        self._clock = clock
        self._held: dict[Backend, int] = {}
        self._waiters: list[_Waiter] = []
        self.busy = BusyWindow(30.0, clock)

    @property
    def depth(self) -> int:
        return len(self._waiters)

    @property
    def active(self) -> int:
        return sum(self._held.values())

    def free(self, backend: Backend) -> bool:
        return self._held.get(backend, 0) < self.slots

    async def acquire(self, tokens: int, service_s: float,
                      choose: Callable[[Callable[[Backend], bool]], Backend | None],
                      ensure_ready: Callable[[], None]) -> Backend:
        """Wait for a slot and return the worker to prefill on. ``choose(is_free)`` is the
        pool's policy among ready workers with a free slot (None when there is none);
        ``ensure_ready()`` raises when the pool has no ready worker at all, which ends the
        wait rather than letting it run into the request timeout."""
        ensure_ready()
        if not self._waiters and (backend := choose(self.free)) is not None:
            self._take(backend)
            return backend
        waiter = _Waiter(tokens, max(service_s, 1e-3), self._clock(),
                         asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(waiter.future), self.RECHECK_S)
                except TimeoutError:
                    self._grant(choose)
                    if not waiter.future.done():
                        ensure_ready()
        except BaseException:
            # Cancelled (the client left) or no worker left: give back what was granted.
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result(), choose)
            else:
                waiter.future.cancel()
                self._waiters.remove(waiter)
            raise

    def release(self, backend: Backend,
                choose: Callable[[Callable[[Backend], bool]], Backend | None]) -> None:
        self._held[backend] -= 1
        if not self._held[backend]:
            del self._held[backend]
        self.busy.stop()
        self._grant(choose)

    def _take(self, backend: Backend) -> None:
        self._held[backend] = self._held.get(backend, 0) + 1
        self.busy.start()

    def _grant(self, choose: Callable[[Callable[[Backend], bool]], Backend | None]) -> None:
        while self._waiters:
            backend = choose(self.free)
            if backend is None:
                return
            now = self._clock()
            best = max(self._waiters, key=lambda w: w.response_ratio(now))
            self._waiters.remove(best)
            self._take(backend)
            best.future.set_result(backend)


class AdaptivePlacer:
    """Chooses local, remote or prefill_whole for each request (see the module docstring)."""

    # Below this share of the last 30 s spent prefilling, a prefill worker counts as idle
    # and may take whole short requests.
    IDLE_BUSY_FRACTION = 0.05

    def __init__(self, *, floor_tokens: int, stall_budget_s: float, queue: PrefillQueue):
        # Prompts within one KV block carry nothing a KV channel could move.
        self.floor_tokens = floor_tokens
        self.stall_budget_s = stall_budget_s
        self.queue = queue
        self.remote_speed = Speed()
        self.local_speed = Speed()

    def local_max_tokens(self) -> int:
        """The longest prompt a decode worker prefills itself: what its measured speed (or,
        before any local measurement, the prefill workers') computes within the budget."""
        speed = self.local_speed.tokens_per_s or self.remote_speed.tokens_per_s
        if speed is None:
            return self.floor_tokens
        return max(self.floor_tokens, int(speed * self.stall_budget_s))

    def service_s(self, tokens: int) -> float:
        speed = self.remote_speed.tokens_per_s
        # Before any measurement the order is by length alone: any common rate does that.
        return tokens / (speed or 1000.0)

    def place(self, tokens: int, prefill_ready: Sequence[Backend],
              decode_ready: Sequence[Backend]) -> Placement:
        if tokens > self.local_max_tokens():
            return Placement("remote", "long_prompt")
        idle = [b for b in prefill_ready if self.queue.free(b)]
        if (idle and not self.queue.depth and not self.queue.active
                and self.queue.busy.fraction() < self.IDLE_BUSY_FRACTION):
            least_prefill = min(b.in_flight for b in idle)
            least_decode = min((b.in_flight for b in decode_ready), default=0)
            if least_prefill < least_decode:
                return Placement("prefill_whole", "prefill_idle")
        return Placement("local", "short_prompt")
