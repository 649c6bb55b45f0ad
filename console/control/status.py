"""A deployment's overall state, derived from its process table."""

from __future__ import annotations

from console.deployments.models import Deployment
from console.quality.services import router_hold
from console.supervisor.models import ManagedProcess


def overall_state(deployment: Deployment, processes: list[ManagedProcess]) -> str:
    """One word for the deployment: stopped, stopping, starting, ready, failed or blocked.

    ``processes`` is passed in (usually prefetched) so listing deployments costs no extra query
    per row.
    """
    states = {p.state for p in processes}
    alive = states & set(ManagedProcess.ALIVE_STATES)
    if deployment.desired_state == Deployment.DesiredState.STOPPED:
        return "stopping" if alive else "stopped"
    expected = len(deployment.workers.all()) + 1  # workers + the router
    if ManagedProcess.State.FAILED in states:
        return "failed"
    if len(processes) >= expected and states == {ManagedProcess.State.READY}:
        return "ready"
    if router_hold(deployment).startswith("output gate"):
        return "blocked"  # the workers run, the router does not: the output gate failed
    return "starting"
