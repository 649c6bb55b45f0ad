"""port.conflict and port.bound: every planned port is planned once and free when it is needed."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView
from console.deployments.models import Deployment, WorkerPlan
from console.deployments.placement import free_port
from console.fleet import port_holders
from inference.kv_channels import NixlChannel


@dataclass(frozen=True)
class PlannedPort:
    node_id: int
    host: str
    port: int
    label: str  # "prefill-0", "decode-0 side channel", "router of deployment x"
    slot: str  # the process slot that binds it
    own: bool


def _uses_side_channel(deployment: Deployment) -> bool:
    # Only NIXL opens the side channel; other channels leave the planned port unused.
    return deployment.kv_channel == NixlChannel.name and deployment.mode == Deployment.Mode.PD


def _worker_ports(worker: WorkerPlan, deployment: Deployment, own: bool) -> list[PlannedPort]:
    suffix = "" if own else f" of running deployment {deployment.name}"
    ports = [PlannedPort(worker.node_id, worker.host, worker.port, f"{worker.slot}{suffix}",
                         worker.slot, own)]
    if worker.side_channel_port and _uses_side_channel(deployment):
        ports.append(PlannedPort(worker.node_id, worker.host, worker.side_channel_port,
                                 f"{worker.slot} side channel{suffix}", worker.slot, own))
    return ports


def planned_ports(plan: PlanView) -> list[PlannedPort]:
    local = plan.local_node.pk
    deployment = plan.deployment
    ports = [p for w in plan.workers for p in _worker_ports(w, deployment, own=True)]
    ports.append(PlannedPort(local, deployment.router_host, deployment.router_port, "router",
                             "router", True))
    for worker in plan.neighbours:
        ports += _worker_ports(worker, worker.deployment, own=False)
    for other in plan.neighbour_deployments:
        ports.append(PlannedPort(local, other.router_host, other.router_port,
                                 f"router of running deployment {other.name}", "router", False))
    return ports


@check("port.conflict", "no port planned twice on a node")
def port_conflict(plan: PlanView) -> Verdict:
    ports = planned_ports(plan)
    by_place: dict[tuple[int, int], list[PlannedPort]] = {}
    for planned in ports:
        by_place.setdefault((planned.node_id, planned.port), []).append(planned)
    taken = {p.port for p in ports}
    findings = []
    nodes = {w.node_id: w.node for w in plan.workers} | {plan.local_node.pk: plan.local_node}
    for (node_id, port), users in by_place.items():
        if len(users) < 2 or not any(u.own for u in users):
            continue
        mover = next(u for u in reversed(users) if u.own)
        node = nodes[node_id]
        suggestion = free_port(port + 1, taken, mover.host, probe=plan.is_local(node))
        taken.add(suggestion)
        findings.append(error(
            f"port {port} on node {node.name} is planned for {' and '.join(u.label for u in users)}",
            f"change the port of {mover.label} to {suggestion} (free)"))
    own = [p for p in ports if p.own]
    summary = ", ".join(f"{p.label} {p.port}" for p in own)
    return Verdict(findings, f"{summary}: each once per node")


@check("port.bound", "no planned port already bound by another process (checked live)")
def port_bound(plan: PlanView) -> Verdict:
    local = plan.local_node
    own = [p for p in planned_ports(plan) if p.own and p.node_id == local.pk]
    own_pids = set().union(*(port_holders.process_tree(p.pid) for p in plan.processes if p.pid))
    failures = {p: code for p in own if (code := port_holders.bind_errno(p.host, p.port)) is not None}
    holders = port_holders.listeners() if failures else {}
    taken = {p.port for p in own}
    findings: list[Finding] = []
    held_by_self = []
    for planned, code in failures.items():
        pids = holders.get(planned.port, set())
        if pids and pids <= own_pids:
            held_by_self.append(planned)
            continue
        findings.append(_bound(planned, code, pids, taken))
    findings += _drift(plan)
    summary = f"{len(own)} planned port(s) on {local.name} probed"
    if held_by_self:
        summary += "; held by this deployment's own processes: " + ", ".join(
            f"{p.label} {p.port}" for p in held_by_self)
    remote = {w.node.name for w in plan.workers if not plan.is_local(w.node)}
    if remote:
        summary += f"; not probed on {', '.join(sorted(remote))} (no node agent yet)"
    return Verdict(findings, summary)


def _bound(planned: PlannedPort, code: int, pids: set[int], taken: set[int]) -> Finding:
    if code == errno.EACCES:
        return error(f"port {planned.port} ({planned.label}) needs privileges the console's user "
                     "lacks (ports below 1024 are reserved)",
                     "use a port from 1024 up")
    if code == errno.EADDRNOTAVAIL:
        return error(f"{planned.label} binds {planned.host}, which is not an address of this "
                     "machine", "place the worker on the node that has this address")
    holder = ", ".join(port_holders.describe_process(pid) for pid in sorted(pids)) or "another process"
    suggestion = free_port(planned.port + 1, taken, planned.host)
    taken.add(suggestion)
    return error(f"port {planned.port} ({planned.label}) is already bound by {holder}",
                 f"stop that process, or change the port of {planned.label} to {suggestion} (free)")


def _drift(plan: PlanView) -> list[Finding]:
    """Running processes whose ports differ from the plan: after an edit, or chosen by the engine."""
    planned = {w.slot: w.port for w in plan.workers} | {"router": plan.deployment.router_port}
    restart = "restart the deployment (Stop, then Start) to apply the plan"
    findings = []
    for process in plan.processes:
        wanted = planned.get(process.slot)
        if wanted is None:
            findings.append(warning(f"{process.slot} is running on port {process.port} but is no "
                                    "longer in the plan", restart))
            continue
        if process.port != wanted:
            findings.append(warning(f"{process.slot} runs on port {process.port}; the plan now "
                                    f"says {wanted}", restart))
            continue
        if process.state != process.State.READY or not process.pid:
            continue
        listening = port_holders.listening_ports(port_holders.process_tree(process.pid))
        if listening and wanted not in listening:
            findings.append(warning(
                f"drift: {process.slot} was planned on port {wanted} but listens on "
                f"{', '.join(map(str, sorted(listening)))}", restart))
    return findings
