"""node.agent: workers are placed only where pdserve can start them."""

from __future__ import annotations

from console.checks.base import Verdict, check, error
from console.checks.plan import PlanView, group, who


@check("node.agent", "every worker is on a node pdserve can start it on")
def node_agent(plan: PlanView) -> Verdict:
    remote = [w for w in plan.workers if not plan.is_local(w.node)]
    findings = [
        error(f"{who(workers, plan)} placed on node {node.name}: the supervisor starts workers "
              "on the local node only until node agents exist",
              f"place {who(workers, plan)} on {plan.local_node.name}, or keep this plan stopped")
        for node, workers in group(remote, lambda w: w.node).items()
    ]
    nodes = ", ".join(dict.fromkeys(w.node.name for w in plan.workers))
    return Verdict(findings, f"workers on {nodes}")
