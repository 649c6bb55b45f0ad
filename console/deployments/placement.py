"""Proposing ports and devices for new worker instances: free ones, colliding with nothing.

A proposal avoids what any deployment plans on the node (running or not, so that starting both
later still works) and, on the local node, ports some process holds right now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node
from console.fleet.port_holders import bind_errno

ROLE_PORT_BASE = {"prefill": 8100, "decode": 8200, "colocated": 8100}
ROUTER_PORT_BASE = 8080
SIDE_CHANNEL_PORT_BASE = 5600
MAX_PORT = 65535


def free_port(start: int, taken: Iterable[int], host: str = "127.0.0.1", probe: bool = True) -> int:
    """The first port from ``start`` up that is not taken and (when probing) can be bound."""
    taken = set(taken)
    for port in range(max(1024, start), MAX_PORT + 1):
        if port in taken:
            continue
        if probe and bind_errno(host, port) is not None:
            continue
        return port
    raise ValueError(f"no free port from {start} up")


@dataclass
class Ledger:
    """What is already planned on one node; proposals are added to it as they are made."""

    node: Node
    ports: set[int]
    cores: dict[int, int]  # core -> how many workers use it
    gpus: set[int]

    @classmethod
    def for_node(cls, node: Node, exclude: Deployment | None,
                 drafts: Iterable[WorkerPlan] = ()) -> Ledger:
        others = WorkerPlan.objects.filter(node=node).select_related("deployment")
        if exclude is not None and exclude.pk:
            others = others.exclude(deployment=exclude)
        ledger = cls(node, set(), {}, set())
        for worker in [*others, *drafts]:
            ledger.take(worker)
        if node.is_local:
            routers = Deployment.objects.all()
            if exclude is not None and exclude.pk:
                routers = routers.exclude(pk=exclude.pk)
            ledger.ports |= set(routers.values_list("router_port", flat=True))
        return ledger

    def take(self, worker: WorkerPlan) -> None:
        self.ports |= {p for p in (worker.port, worker.side_channel_port) if p}
        for core in worker.core_tuple():
            self.cores[core] = self.cores.get(core, 0) + 1
        self.gpus |= set(worker.gpu_tuple())

    def port(self, role: str) -> int:
        port = free_port(ROLE_PORT_BASE.get(role, 8100), self.ports, probe=self.node.is_local)
        self.ports.add(port)
        return port

    def router_port(self) -> int:
        port = free_port(ROUTER_PORT_BASE, self.ports, probe=self.node.is_local)
        self.ports.add(port)
        return port

    def side_channel_port(self) -> int:
        port = free_port(SIDE_CHANNEL_PORT_BASE, self.ports, probe=self.node.is_local)
        self.ports.add(port)
        return port

    def core(self) -> str:
        """The least used core of the node (a free one when there is one)."""
        if not self.node.cpu_ids:
            return ""
        core = min(self.node.cpu_ids, key=lambda c: (self.cores.get(c, 0), c))
        self.cores[core] = self.cores.get(core, 0) + 1
        return str(core)

    def gpu(self) -> str:
        free = [g.index for g in self.node.gpus.all() if g.index not in self.gpus]
        if not free:
            return ""
        self.gpus.add(free[0])
        return str(free[0])
