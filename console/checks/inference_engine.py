"""engine.version and engine.connector: the same vLLM and KV connector on both sides."""

from __future__ import annotations

from console.checks.base import Finding, Verdict, check, error
from console.checks.plan import PlanView, describe, group, node_names, who
from console.fleet.discovery import connector_name
from inference.kv_channels import SharedStorageChannel


@check("engine.version", "identical vLLM version on both sides")
def engine_version(plan: PlanView) -> Verdict:
    wanted = plan.deployment.engine_version
    count, text = describe(plan, lambda w: w.node.engine_version,
                           lambda v: v or "no vLLM", where=node_names)
    findings: list[Finding] = []
    for version, workers in group(plan.workers, lambda w: w.node.engine_version).items():
        nodes = node_names(workers)
        if not version:
            install = f"install vLLM {wanted}" if wanted else "install vLLM"
            findings.append(error(f"{who(workers, plan)}: {nodes} has no vLLM installed",
                                  f"{install} there, or place the workers on a node that has it"))
        elif wanted and version != wanted:
            findings.append(error(
                f"{who(workers, plan)}: {nodes} runs vLLM {version}; the plan wants {wanted}",
                f"install vLLM {wanted} on {nodes.removeprefix('node ')}, or set the plan's engine "
                f"version to {version} if every node runs it"))
    if count > 1 and not wanted:
        findings.append(error(f"vLLM versions differ: {text}",
                              "run one vLLM version on every node of the deployment"))
    return Verdict(findings, f"{text}; plan: {wanted or 'any, if equal'}")


@check("engine.connector", "identical KV connector on both sides, available on each node")
def engine_connector(plan: PlanView) -> Verdict:
    if not plan.is_pd:
        return Verdict(summary="colocated: no KV connector")
    channel = plan.deployment.kv_channel
    connector = connector_name(channel)
    findings: list[Finding] = []
    for available, workers in group(plan.workers, lambda w: tuple(w.node.kv_connectors)).items():
        if connector not in available:
            nodes = node_names(workers)
            findings.append(error(
                f"{who(workers, plan)}: {nodes} cannot run {connector} (the {channel} channel); "
                f"it offers {', '.join(available) or 'no connector'}",
                "install the nixl package there" if channel == "nixl"
                else "install vLLM there"))
    nodes = {w.node_id for w in plan.workers}
    if channel == SharedStorageChannel.name and len(nodes) > 1:
        findings.append(error(
            f"the shared-storage channel keeps KV files in a directory of one host, but the "
            f"workers are on {node_names(plan.workers)}",
            "use the nixl channel across hosts, or place prefill and decode on one node"))
    roles = {"prefill": "kv_producer", "decode": "kv_consumer"}
    sides = "; ".join(f"{role}: {connector} as {roles[role]}" for role in roles)
    return Verdict(findings, f"{sides} (channel {channel})")
