"""What the console asks a node agent on its node's Celery queue (``node.NAME``), and the calls
that send it.

The plan in the database is what an agent's supervisor runs; a control message tells it to act
on a change now rather than at its next tick (start, stop, drain, scale), so a lost message
delays nothing beyond one tick. A probe is a question only the node itself can answer: whether
it reaches an address and port.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from console.celery import app
from console.deployments.models import Deployment
from console.fleet.services import agent_node_ids

log = logging.getLogger("pdserve.agents")

# Set by the agent's tasks, waited on by its supervisor's loop (manage.py agent).
WAKE = threading.Event()
# A control message older than this is dropped by Redis' consumer: the plan has moved on, and
# the agent's tick has acted on it meanwhile.
CONTROL_EXPIRES_S = 60


def queue_name(node_name: str) -> str:
    return f"node.{node_name}"


@app.task(name="agent.control", ignore_result=True)
def control(action: str, deployment: str) -> None:
    """Reconcile now: ``action`` (start, stop, drain, scale) of ``deployment`` changed the plan."""
    log.info("control: %s %s", action, deployment)
    WAKE.set()


@app.task(name="agent.probe")
def probe(host: str, port: int, timeout_s: float = 2.0) -> dict[str, object]:
    """Whether this node opens a TCP connection to ``host:port``, and how long it took."""
    started = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc),
                "ms": round((time.perf_counter() - started) * 1000, 2)}
    return {"ok": True, "error": "", "ms": round((time.perf_counter() - started) * 1000, 2)}


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
