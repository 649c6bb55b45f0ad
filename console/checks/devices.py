"""device.conflict: no CPU core or GPU used by two workers of one node, unless declared shared."""

from __future__ import annotations

from dataclasses import dataclass

from console.checks.base import Finding, Verdict, check, error
from console.checks.plan import PlanView
from console.deployments.models import WorkerPlan
from console.fleet.models import Node


@dataclass(frozen=True)
class User:
    worker: WorkerPlan
    own: bool  # a worker of the plan being checked, not of another running deployment

    @property
    def label(self) -> str:
        if self.own:
            return self.worker.slot
        return f"{self.worker.slot} of running deployment {self.worker.deployment.name}"


def devices(worker: WorkerPlan, node: Node) -> list[tuple[str, int]]:
    gpus = worker.gpu_tuple()
    cores = worker.core_tuple()
    # An unpinned CPU worker spreads its threads over every core of the node.
    if not gpus and not cores:
        cores = tuple(node.cpu_ids)
    return [("gpu", i) for i in gpus] + [("core", c) for c in cores]


@check("device.conflict", "no core or GPU used by two workers on one node, unless shared")
def device_conflict(plan: PlanView) -> Verdict:
    findings: list[Finding] = []
    usage: dict[tuple[int, str, int], list[User]] = {}
    users = [User(w, True) for w in plan.workers] + [User(w, False) for w in plan.neighbours]
    gpu_indices = {w.node_id: {g.index for g in w.node.gpus.all()} for w in plan.workers}
    for user in users:
        node = user.worker.node
        for kind, index in devices(user.worker, node):
            usage.setdefault((node.pk, kind, index), []).append(user)
    for worker in plan.workers:
        findings += _missing_devices(worker, gpu_indices[worker.node_id])
    shared = []
    for (_node, kind, index), sharing in usage.items():
        if len(sharing) < 2 or not any(u.own for u in sharing):
            continue
        node = sharing[0].worker.node
        names = " and ".join(u.label for u in sharing)
        if all(u.worker.share_devices for u in sharing):
            shared.append(f"{kind} {index} on {node.name} ({names})")
            continue
        findings.append(error(
            f"{kind} {index} on node {node.name} is used by {names}",
            _hint(kind, sharing, usage)))
    summary = "; ".join(
        f"{w.slot}: {_placement(w)} on {w.node.name}" for w in plan.workers)
    if shared:
        summary += "; declared shared: " + ", ".join(shared)
    return Verdict(findings, summary)


def _placement(worker: WorkerPlan) -> str:
    if worker.gpu_indices:
        return f"GPU {worker.gpu_indices}"
    return f"cores {worker.cpu_cores}" if worker.cpu_cores else "all cores (unpinned)"


def _missing_devices(worker: WorkerPlan, gpus: set[int]) -> list[Finding]:
    node = worker.node
    findings = []
    absent_cores = [c for c in worker.core_tuple() if c not in node.cpu_ids]
    if absent_cores:
        findings.append(error(
            f"{worker.slot} is pinned to core(s) {', '.join(map(str, absent_cores))}, which node "
            f"{node.name} does not have (its cores: {_ranges(node.cpu_ids)})",
            f"pick cores among {_ranges(node.cpu_ids)}"))
    absent_gpus = [g for g in worker.gpu_tuple() if g not in gpus]
    if absent_gpus:
        have = ", ".join(map(str, sorted(gpus))) or "none"
        findings.append(error(
            f"{worker.slot} uses GPU(s) {', '.join(map(str, absent_gpus))}, which node {node.name} "
            f"does not have (its GPUs: {have})",
            "pick GPUs the node has, or leave the GPU list empty to run on CPU cores"))
    return findings


def _hint(kind: str, sharing: list[User], usage: dict[tuple[int, str, int], list[User]]) -> str:
    mover = next(u for u in reversed(sharing) if u.own).worker
    node = mover.node  # the plan's own copy, whose GPUs are prefetched
    used = {index for (node_id, k, index) in usage if node_id == node.pk and k == kind}
    pool = node.cpu_ids if kind == "core" else [g.index for g in node.gpus.all()]
    free = [i for i in pool if i not in used]
    move = (f"give {mover.slot} {kind} {free[0]} (free)" if free
            else f"node {node.name} has no free {kind}: move {mover.slot} to another node")
    return f"{move}, or declare sharing on every worker involved if they may share"


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "none"
    spans, start, prev = [], ids[0], ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        spans.append(f"{start}-{prev}" if prev != start else str(start))
        if i is not None:
            start = prev = i
    return ", ".join(spans)
