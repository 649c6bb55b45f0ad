"""node.agent: workers are placed only where pdserve can start them: the console's own node
(``manage.py supervise``), or a node whose agent (``manage.py agent --node``) has registered."""

from __future__ import annotations

from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView, group, who
from console.fleet.models import NodeAgent


@check("node.agent", "every worker is on a node pdserve can start it on")
def node_agent(plan: PlanView) -> Verdict:
    remote = [w for w in plan.workers if not plan.is_local(w.node)]
    placed = group(remote, lambda w: w.node)
    agents = {a.node_id: a for a in NodeAgent.objects.filter(node__in=list(placed))}
    findings: list[Finding] = []
    for node, workers in placed.items():
        agent = agents.get(node.pk)
        if agent is None:
            findings.append(error(
                f"{who(workers, plan)} placed on node {node.name}, where no node agent has run: "
                "nothing would start them",
                f"run `manage.py agent --node {node.name}` on {node.name} (with the console's "
                f"DATABASE_URL and REDIS_URL), or place {who(workers, plan)} on "
                f"{plan.local_node.name}"))
        elif agent.state == NodeAgent.State.DOWN:
            findings.append(warning(
                f"{who(workers, plan)} placed on node {node.name}, whose agent is down (no "
                f"heartbeat since {agent.seen_at:%Y-%m-%d %H:%M:%S} UTC): they start once it "
                "is back",
                f"start `manage.py agent --node {node.name}` on {node.name} again"))
    nodes = ", ".join(dict.fromkeys(
        w.node.name + ("" if plan.is_local(w.node) else f" (agent {agents[w.node.pk].state})"
                       if w.node.pk in agents else "") for w in plan.workers))
    return Verdict(findings, f"workers on {nodes}")
