"""node.reach: prefill and decode on different nodes reach each other, as their agents find.

For each prefill worker, the node holding it listens on the worker's planned ports for a few
seconds (or its worker already does, when the deployment runs), the nodes of the decode
workers open a connection to its NIXL side channel, and the console's node (where the router
runs) to its HTTP port. Each node also says which interface UCX will use for its workers'
address: an address no interface holds cannot be bound, and a node with active RDMA ports
whose KV goes over TCP is a warning. The probes are the agents' (console/fleet/agent_calls.py):
the answer is the network's, not this process's. Only KV over NIXL crosses nodes this way;
an agent that does not answer is a warning, and node.agent says why it may not.
"""

from __future__ import annotations

from typing import Any

from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView
from console.deployments.models import WorkerPlan
from console.fleet import agent_calls
from console.fleet.agent_calls import AgentSilent
from console.fleet.models import Node, NodeAgent
from inference.kv_channels import UCX_REMOTE_TRANSPORTS

# Long enough for every prober to connect after the listener answered (each probe is one
# round trip through Redis, milliseconds).
LISTEN_S = 5.0


class _Nodes:
    """Runs a question on a node: in this process on the console's own node, else by its agent."""

    def __init__(self, plan: PlanView) -> None:
        self.plan = plan
        self.agents = {a.node_id: a for a in NodeAgent.objects.filter(
            node__in={w.node_id for w in plan.workers})}

    def reachable(self, node: Node) -> bool:
        if self.plan.is_local(node):
            return True
        agent = self.agents.get(node.pk)
        return agent is not None and agent.state == NodeAgent.State.UP

    def ask(self, node: Node, task: Any, *args: Any) -> Any:
        if self.plan.is_local(node):
            return task.run(*args)
        return agent_calls.ask(node.name, task, *args)


@check("node.reach", "prefill and decode on different nodes reach each other, as the nodes find")
def node_reach(plan: PlanView) -> Verdict:
    if plan.deployment.kv_channel != "nixl":
        return Verdict([], "KV crosses no network (not NIXL)")
    prefills = [w for w in plan.workers if w.role == WorkerPlan.Role.PREFILL]
    decodes = [w for w in plan.workers if w.role == WorkerPlan.Role.DECODE]
    pairs = [(p, d) for p in prefills for d in decodes if p.node_id != d.node_id]
    if not pairs:
        return Verdict([], "prefill and decode share their nodes")
    nodes = _Nodes(plan)
    silent = sorted({w.node.name for pair in pairs for w in pair if not nodes.reachable(w.node)})
    if silent:
        return Verdict([], f"no agent up on {', '.join(silent)} to probe from (see node.agent)",
                       skipped=True)
    findings: list[Finding] = []
    probed: list[str] = []
    try:
        findings += _interfaces(plan, nodes, probed)
        running = {p.slot for p in plan.processes if p.role == WorkerPlan.Role.PREFILL}
        for prefill in prefills:
            targets = [(d, prefill.side_channel_port, "its NIXL side channel")
                       for p, d in pairs if p is prefill and prefill.side_channel_port]
            if not targets:
                continue
            findings += _listen(nodes, prefill, running)
            for decode, port, what in targets:
                findings += _probe(nodes, decode.node, decode.slot, prefill, port, what, probed)
            if not plan.is_local(prefill.node):
                findings += _probe(nodes, plan.local_node, "the router", prefill, prefill.port,
                                   "its HTTP port", probed)
    except AgentSilent as exc:
        findings.append(warning(f"could not probe between the nodes: {exc}",
                                "check that the node's agent runs and reaches Redis"))
    return Verdict(findings, "; ".join(probed))


def _interfaces(plan: PlanView, nodes: _Nodes, probed: list[str]) -> list[Finding]:
    findings = []
    for worker in plan.workers:
        if worker.role not in (WorkerPlan.Role.PREFILL, WorkerPlan.Role.DECODE):
            continue
        answer = nodes.ask(worker.node, agent_calls.network, worker.host)
        devices, rdma = answer["net_devices"], list(answer["rdma"])
        if devices is None:
            findings.append(error(
                f"{worker.slot}'s address {worker.host} is on no interface of node "
                f"{worker.node.name}: the worker could not bind it",
                f"set node {worker.node.name}'s address to one of its own"))
            continue
        device = "cuda" if worker.gpu_indices else "cpu"
        probed.append(f"{worker.slot} UCX {UCX_REMOTE_TRANSPORTS[device]} on {devices}")
        if rdma and device == "cpu":
            findings.append(warning(
                f"{worker.slot}'s KV goes over TCP on {devices}, while node {worker.node.name} "
                f"has RDMA ports ({', '.join(rdma)}): the CPU connector moves KV over TCP only",
                "serve KV from GPU workers to use RDMA"))
    return findings


def _listen(nodes: _Nodes, prefill: WorkerPlan, running: set[str]) -> list[Finding]:
    ports = [port for port in (prefill.side_channel_port, prefill.port) if port]
    answer = nodes.ask(prefill.node, agent_calls.listen, prefill.host, ports, LISTEN_S)
    if prefill.slot in running:
        return []  # its own worker holds them
    return [error(f"port {port} of {prefill.slot} is taken on node {prefill.node.name} "
                  f"({why})", f"choose another port for {prefill.slot}, or stop what holds it")
            for port, why in answer.items() if why]


def _probe(nodes: _Nodes, source: Node, who: str, prefill: WorkerPlan, port: int,
           what: str, probed: list[str]) -> list[Finding]:
    answer = nodes.ask(source, agent_calls.probe, prefill.host, port, 2.0)
    if answer["ok"]:
        probed.append(f"{who} on {source.name} reaches {prefill.slot}:{port} in {answer['ms']} ms")
        return []
    return [error(f"{who} on node {source.name} cannot reach {prefill.slot}'s {what} at "
                  f"{prefill.host}:{port} ({answer['error']})",
                  f"let node {source.name} connect to {prefill.node.name} on TCP port {port} "
                  "(and UCX's data connections: any port, unless UCX_TCP_PORT_RANGE is set)")]
