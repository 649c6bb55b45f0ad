"""A deployment's overall state, derived from its process table."""

from __future__ import annotations

from console.deployments.models import Deployment
from console.quality.services import router_hold
from console.supervisor.models import ManagedProcess


def overall_state(deployment: Deployment, processes: list[ManagedProcess]) -> str:
    """One word for the deployment: stopped, stopping, starting, ready, degraded, failed or
    blocked.

    ``processes`` is passed in (usually prefetched) so listing deployments costs no extra query
    per row.
    """
    states = {p.state for p in processes}
    alive = states & set(ManagedProcess.ALIVE_STATES)
    if deployment.desired_state == Deployment.DesiredState.STOPPED:
        return "stopping" if alive else "stopped"
    # The plan's slots decide: a slot the plan no longer has leaves a stopped row behind (or a
    # draining one, still finishing its requests), which neither fails nor holds up the rest.
    planned = {w.slot for w in deployment.workers.all()} | {"router"}
    current = {p.slot: p.state for p in processes if p.slot in planned}
    if degraded_role(processes):
        # The router serves every request with one role alone; a failed worker of the other
        # role is why, and the process table shows it.
        return "degraded"
    if ManagedProcess.State.FAILED in current.values():
        return "failed"
    if current.keys() == planned and set(current.values()) == {ManagedProcess.State.READY}:
        return "ready"
    if router_hold(deployment).startswith("output gate"):
        return "blocked"  # the workers run, the router does not: the output gate failed
    return "starting"


def degraded_role(processes: list[ManagedProcess]) -> str:
    """The role a ready router serves without (its /health said "degraded"), else ""."""
    router = next((p for p in processes if p.slot == "router"), None)
    if router is None or router.state != ManagedProcess.State.READY:
        return ""
    return router.degraded
