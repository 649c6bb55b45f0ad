"""Priority and fairness while a deployment is saturated: the gateway's queues.

Each deployment with a concurrency limit (``max_concurrency`` in the configuration: the plan's
requests per worker times its ready serving workers) holds at most that many requests in flight
through this gateway. A request past it waits here rather than in an engine's queue, where it
would already hold a worker's KV cache and could no longer be reordered (llm-d's flow control
makes the same choice). When a slot frees, the next request is taken

- from the highest priority band that has one waiting (``BANDS``, highest first);
- inside a band, from the fairness flow that holds fewest slots now, then the one served
  least (start-time fair queueing): a team that sends ten times as many requests as another
  gets the same share of the slots while both wait. Slots held come first because they are the
  deployment's capacity: after a moment when nothing waited and arrivals took the free slots
  first come first served, the flow that got fewer is made whole at once rather than only
  given every other slot from then on; and a team whose requests are longer holds its slots
  longer, so it is not also given more of them. A flow whose queue ran empty for a moment
  takes its turn back rather than waiting behind the others, as plain round robin would make
  it;
- inside a flow, first come first served.

The queue of a deployment is bounded (``max_queue``). A request that arrives at a full queue
either displaces a request of the lowest band waiting (the newest of its largest flow), when
its own band is higher or its flow holds less of the deployment, or is refused itself: the
lowest band is shed first, and inside a band the flow that holds most, with 429 and
``Retry-After``. What a flow holds is its requests waiting in that band and its requests in
flight: a flow that won more slots for a moment is not also given more of the queue, so a
team that sends no more than its half of slots and queue is never refused. A request
that waits longer than ``queue_timeout_s`` is answered 503 ``queue_timeout``, never dropped
silently. A client that leaves while it waits gives its place back.

Saturation is counted here, by this gateway's own requests in flight: clients that use a
deployment's own port bypass these queues (the deployment's router still applies its keys'
limits to them).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

# Highest first. "low" is the band shed first; "normal" is what a key without a priority gets.
BANDS = ("high", "normal", "low")
DEFAULT_BAND = "normal"
BAND_RANK = {band: rank for rank, band in enumerate(BANDS)}
DEFAULT_MAX_QUEUE = 64
DEFAULT_QUEUE_TIMEOUT_S = 60.0
# Flows whose dispatch counts are kept beyond those waiting (a header may name many).
MAX_REMEMBERED_FLOWS = 1024
# How quickly the estimate of a request's time in flight follows new requests (Retry-After).
EWMA_WEIGHT = 0.2


class Refused(Exception):
    """A request the queue will not serve: ``status`` 429 (shed) or 503 (waited too long)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: int):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class _Ticket:
    band: int
    flow: str
    waiter: asyncio.Future[None]
    queued_at: float
    granted: bool = False


@dataclass
class QueueStats:
    """What one deployment's queue holds now, for the metrics and the admin API."""

    limit: int
    waiting: dict[tuple[str, str], int] = field(default_factory=dict)  # (band, flow) -> count
    # flow -> requests in flight: the slots each flow holds, which fairness shares out
    holding: dict[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return sum(self.holding.values())


class DeploymentQueue:
    def __init__(self, name: str, limit: int, max_queue: int = DEFAULT_MAX_QUEUE,
                 timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.limit = limit
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        # Requests in flight per flow; a flow with none in flight has no entry.
        self._holding: dict[str, int] = {}
        self._clock = clock
        # One ordered map of flows per band: the first flow is the next to be served, and a
        # flow served goes to the end while it still has requests waiting.
        self._bands: list[OrderedDict[str, deque[_Ticket]]] = [OrderedDict() for _ in BANDS]
        self._waiting = 0
        # Start-time fair queueing over flows: requests dispatched per flow, and the count of
        # the flow served last (the queue's virtual time).
        self._served: dict[str, int] = {}
        self._virtual = 0
        self._held_s = 1.0  # EWMA of a request's time in flight, for Retry-After

    @property
    def in_flight(self) -> int:
        # As many flows as requests in flight at most: bounded by the limit, a short sum.
        return sum(self._holding.values())

    # ---- the request's side ---------------------------------------------------------
    async def acquire(self, band: str, flow: str) -> float:
        """Wait for a slot; returns the seconds waited. Raises Refused."""
        if self.in_flight < self.limit and not self._waiting:
            self._hold(flow)
            return 0.0
        rank = BAND_RANK[band]
        if self._waiting >= self.max_queue:
            self._make_room(rank, flow)
        loop = asyncio.get_running_loop()
        ticket = _Ticket(rank, flow, loop.create_future(), self._clock())
        flows = self._bands[rank]
        if flow not in flows:
            self._activate(flow)
        flows.setdefault(flow, deque()).append(ticket)
        self._waiting += 1
        # A timer rather than asyncio.wait_for: on Python 3.11, wait_for swallows a
        # cancellation that comes in the same step as the result.
        timer = loop.call_later(self.timeout_s, self._expire, ticket)
        try:
            # Its result is the slot; a shed or expired ticket's is the Refused that ended it.
            await ticket.waiter
        except asyncio.CancelledError:
            # The client left: its place goes, and a slot granted meanwhile goes to the next.
            if ticket.granted:
                self.release(0.0, flow)
            else:
                self._withdraw(ticket)
            raise
        finally:
            timer.cancel()
        return self._clock() - ticket.queued_at

    def release(self, held_s: float, flow: str) -> None:
        """A request of ``flow`` in flight ended after ``held_s`` seconds: its slot goes to the
        next one."""
        left = self._holding[flow] - 1
        if left:
            self._holding[flow] = left
        else:
            del self._holding[flow]
        if held_s > 0:
            self._held_s += EWMA_WEIGHT * (held_s - self._held_s)
        self._dispatch()

    def resize(self, limit: int, max_queue: int, timeout_s: float) -> None:
        """A new configuration: requests in flight stay counted against the new limit."""
        self.limit, self.max_queue, self.timeout_s = limit, max_queue, timeout_s
        self._dispatch()

    # ---- inside -----------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self.in_flight < self.limit and self._waiting:
            ticket = self._next()
            if ticket.waiter.done():  # cancelled, its task not run yet to withdraw it
                continue
            self._hold(ticket.flow)
            ticket.granted = True
            ticket.waiter.set_result(None)

    def _hold(self, flow: str) -> None:
        self._holding[flow] = self._holding.get(flow, 0) + 1

    def _expire(self, ticket: _Ticket) -> None:
        if self._withdraw(ticket):
            ticket.waiter.set_exception(Refused(
                503, "queue_timeout",
                f"deployment {self.name} stayed saturated: the request waited {self.timeout_s:g} s "
                f"in the gateway's {BANDS[ticket.band]!r} priority queue without a free slot",
                self.retry_after_s()))

    def _next(self) -> _Ticket:
        for flows in self._bands:
            if flows:
                # The flow holding fewest slots; then the one served least so far; then the one
                # whose request came first.
                flow = min(flows, key=lambda name: (self._holding.get(name, 0),
                                                    self._served.get(name, 0),
                                                    flows[name][0].queued_at))
                tickets = flows[flow]
                ticket = tickets.popleft()
                if not tickets:
                    del flows[flow]
                self._virtual = self._served.get(flow, 0)
                self._served[flow] = self._virtual + 1
                self._waiting -= 1
                return ticket
        raise AssertionError("_next called with nothing waiting")

    def _activate(self, flow: str) -> None:
        """A flow that starts waiting again takes its turn from now on: it keeps no credit for
        the time it had nothing waiting (else it could take every slot for a while), and loses
        none either (plain round robin would put it behind every flow served meanwhile)."""
        self._served[flow] = max(self._served.get(flow, 0), self._virtual)
        if len(self._served) > MAX_REMEMBERED_FLOWS:
            waiting = {name for flows in self._bands for name in flows}
            self._served = {name: count for name, count in self._served.items()
                            if name in waiting or count > self._virtual}

    def _make_room(self, rank: int, flow: str) -> None:
        """Shed one request to make room for one of band ``rank`` and ``flow``.

        The lowest band waiting is shed first. Inside it the victim is the newest request of
        the flow that holds most (waiting in that band and in flight), so that a flood cannot
        take the whole deployment from a flow that sends little. The newcomer itself is
        refused when it is of that band and its flow would then hold as much as the largest."""
        waiting = [r for r, flows in enumerate(self._bands) if flows]
        lowest = max(waiting, default=-1)
        if lowest < rank:
            raise self._full(rank)
        flows = self._bands[lowest]

        def holds(name: str) -> int:
            return len(flows.get(name, ())) + self._holding.get(name, 0)

        largest = max(flows, key=lambda name: (holds(name), flows[name][-1].queued_at))
        if lowest == rank and holds(flow) + 1 >= holds(largest):
            raise self._full(rank)
        victim = flows[largest].pop()
        if not flows[largest]:
            del flows[largest]
        self._waiting -= 1
        if victim.waiter.done():  # its client left; its task has not withdrawn it yet
            return
        victim.waiter.set_exception(Refused(
            429, "shed", f"deployment {self.name} is saturated: the request was shed from the "
                         f"gateway's {BANDS[lowest]!r} priority queue to make room for another "
                         "flow's or a higher band's", self.retry_after_s()))

    def _full(self, rank: int) -> Refused:
        return Refused(429, "queue_full",
                       f"deployment {self.name} is saturated and its gateway queue is full "
                       f"({self.max_queue} waiting); the request's priority band "
                       f"{BANDS[rank]!r} is shed first", self.retry_after_s())

    def _withdraw(self, ticket: _Ticket) -> bool:
        """Take a ticket out of its queue; False if it was not there any more (granted or
        shed)."""
        flows = self._bands[ticket.band]
        tickets = flows.get(ticket.flow)
        if tickets is None or ticket not in tickets:
            return False
        tickets.remove(ticket)
        if not tickets:
            del flows[ticket.flow]
        self._waiting -= 1
        return True

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely moved past one more request: the requests ahead
        of it, served ``limit`` at a time, each for about the recent time in flight."""
        return max(1, math.ceil(self._held_s * (self._waiting + 1) / max(1, self.limit)))

    def stats(self) -> QueueStats:
        waiting = {(BANDS[rank], flow): len(tickets)
                   for rank, flows in enumerate(self._bands) for flow, tickets in flows.items()}
        return QueueStats(self.limit, waiting, dict(self._holding))


class FlowControl:
    """The queues of every deployment with a concurrency limit, kept across configurations."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.queues: dict[str, DeploymentQueue] = {}

    def configure(self, limits: dict[str, int], max_queue: int, timeout_s: float) -> None:
        """``limits``: deployment name -> requests in flight. A deployment left out (or whose
        limit is 0) is not queued; its requests in flight finish as they are."""
        for name in list(self.queues):
            if not limits.get(name):
                del self.queues[name]
        for name, limit in limits.items():
            if not limit:
                continue
            queue = self.queues.get(name)
            if queue is None:
                self.queues[name] = DeploymentQueue(name, limit, max_queue, timeout_s, self._clock)
            else:
                queue.resize(limit, max_queue, timeout_s)

    def queue(self, deployment: str) -> DeploymentQueue | None:
        return self.queues.get(deployment)
