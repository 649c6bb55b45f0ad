"""Control messages to a node agent on its node's Celery queue (``node.NAME``), and the call
that sends them. The questions only a node can answer (probes) are console/fleet/agent_calls.py.

The plan in the database is what an agent's supervisor runs; a control message tells it to act
on a change now rather than at its next tick (start, stop, drain, scale), so a lost message
delays nothing beyond one tick.
"""

from __future__ import annotations

import logging
import threading

from console.celery import app
from console.deployments.models import Deployment
from console.fleet.agent_calls import queue_name
from console.fleet.services import agent_node_ids

log = logging.getLogger("pdserve.agents")

# Set by the agent's tasks, waited on by its supervisor's loop (manage.py agent).
WAKE = threading.Event()
# A control message older than this is dropped by Redis' consumer: the plan has moved on, and
# the agent's tick has acted on it meanwhile.
CONTROL_EXPIRES_S = 60


@app.task(name="agent.control", ignore_result=True)
def control(action: str, deployment: str) -> None:
    """Reconcile now: ``action`` (start, stop, drain, scale) of ``deployment`` changed the plan."""
    log.info("control: %s %s", action, deployment)
    WAKE.set()


def notify_agents(deployment: Deployment, action: str) -> list[str]:
    """Send ``action`` to the agents of the nodes ``deployment``'s workers are placed on.
    Returns the queues written to."""
    agents = agent_node_ids()
    nodes = {w.node.name for w in deployment.workers.select_related("node")
             if w.node_id in agents}
    for name in sorted(nodes):
        control.apply_async(args=[action, deployment.name], queue=queue_name(name),
                            expires=CONTROL_EXPIRES_S)
    return sorted(queue_name(n) for n in nodes)
