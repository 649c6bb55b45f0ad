"""The discrete-event simulation of a load against a topology (DistServe's method).

Events are arrivals, ends of engine steps and ends of KV hand-offs, in time order. A request
goes to the server of its pool with the fewest outstanding requests, ties taken in turn, as
the router's ``least_outstanding`` policy does. Colocated: it is prefilled and decoded on that
server. PD: it queues on a prefill server, then after the hand-off time it joins the running
batch of a decode server, which emits its first token with its next step (the router streams
decode's tokens, so TTFT = prefill queue + prefill + hand-off + decode's first step).
Every server is on one node: a step that starts while another server is mid-step costs the
measured neighbour factor more (speeds.py), whichever pool the other is in.

Nothing is random here: the same workload and speeds give the same result.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from inference.advisor.engine import Request, Role, Server
from inference.advisor.load import Workload
from inference.advisor.speeds import Speeds

# At one instant: steps end, then hand-offs land, then requests arrive, and only then do idle
# servers plan their next step, so a step takes in everything that arrived by its start
# (two requests arriving together are prefilled together).
STEP_END, HANDOFF, ARRIVAL, STEP_START = 0, 1, 2, 3


@dataclass(frozen=True)
class Topology:
    colocated: int = 0
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        colocated = self.colocated > 0 and self.prefill == self.decode == 0
        disaggregated = self.colocated == 0 and self.prefill > 0 and self.decode > 0
        if not (colocated or disaggregated):
            raise ValueError(f"{self}: either colocated servers, or prefill and decode servers")

    @property
    def servers(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def label(self) -> str:
        return f"colocated x{self.colocated}" if self.colocated else \
            f"PD {self.prefill}P:{self.decode}D"


@dataclass(frozen=True)
class Outcome:
    """Per request, in arrival order (seconds); ``tpot_s`` is NaN for one-token answers."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    itl_s: np.ndarray  # every gap between tokens, pooled over requests
    duration_s: float  # from the first arrival to the last completion


class Pool:
    def __init__(self, role: Role, count: int, speeds: Speeds) -> None:
        self.servers = [Server(role, speeds) for _ in range(count)]
        self._turn = itertools.count()

    def least_outstanding(self) -> Server:
        fewest = min(s.outstanding() for s in self.servers)
        tied = [s for s in self.servers if s.outstanding() == fewest]
        return tied[next(self._turn) % len(tied)]


class Simulation:
    def __init__(self, topology: Topology, speeds: Speeds) -> None:
        self.speeds = speeds
        if topology.colocated:
            self.entry = Pool("colocated", topology.colocated, speeds)
            self.decode = self.entry
        else:
            self.entry = Pool("prefill", topology.prefill, speeds)
            self.decode = Pool("decode", topology.decode, speeds)
        self.servers = self.entry.servers + (self.decode.servers if self.decode is not self.entry
                                             else [])
        self.events: list[tuple[float, int, int, object]] = []
        self._order = itertools.count()
        self._starting: set[Server] = set()

    def _push(self, time: float, kind: int, subject: object) -> None:
        heapq.heappush(self.events, (time, kind, next(self._order), subject))

    def _enqueue(self, pool: Pool, request: Request, now: float) -> None:
        server = pool.least_outstanding()
        server.waiting.append(request)
        if server.step is None:
            self._wake(server, now)

    def _wake(self, server: Server, now: float) -> None:
        if server not in self._starting:
            self._starting.add(server)
            self._push(now, STEP_START, server)

    def _start(self, server: Server, now: float) -> None:
        self._starting.discard(server)
        server.step = server.plan()
        if server.step is not None:
            if self.speeds.neighbour_factor != 1.0 and self._beside_another(server):
                server.step.seconds *= self.speeds.neighbour_factor
            self._push(now + server.step.seconds, STEP_END, server)

    def _beside_another(self, server: Server) -> bool:
        """Another server is mid-step, or starts one at this same instant (its start event is
        still queued, but the two steps run side by side)."""
        return any(other.step is not None or (other in self._starting and other.outstanding())
                   for other in self.servers if other is not server)

    def run(self, workload: Workload) -> Outcome:
        requests = [Request(float(a), int(p), int(o)) for a, p, o in
                    zip(workload.arrival_s, workload.prompt_tokens, workload.output_tokens, strict=True)]
        for request in requests:
            self._push(request.arrival, ARRIVAL, request)
        while self.events:
            now, kind, _, subject = heapq.heappop(self.events)
            if kind == ARRIVAL:
                assert isinstance(subject, Request)
                self._enqueue(self.entry, subject, now)
            elif kind == HANDOFF:
                assert isinstance(subject, Request)
                self._enqueue(self.decode, subject, now)
            elif kind == STEP_END:
                assert isinstance(subject, Server)
                for request in subject.finish(now):
                    self._push(now + self.speeds.handoff_ms(request.prompt) / 1000.0, HANDOFF,
                               request)
                self._wake(subject, now)
            else:
                assert isinstance(subject, Server)
                self._start(subject, now)
        return outcome(requests)


def outcome(requests: list[Request]) -> Outcome:
    arrival = np.array([r.arrival for r in requests])
    first = np.array([r.first_token for r in requests])
    finished = np.array([r.finished for r in requests])
    output = np.array([r.output for r in requests])
    ttft, e2e = first - arrival, finished - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
    gaps = [gap for r in requests for gap in r.gaps]
    return Outcome(ttft, tpot, e2e, np.array(gaps), float(finished.max() - arrival.min()))


def simulate(workload: Workload, topology: Topology, speeds: Speeds) -> Outcome:
    return Simulation(topology, speeds).run(workload)
