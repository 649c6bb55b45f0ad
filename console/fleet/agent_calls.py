"""Questions only a node itself can answer, asked of its agent on its queue (``node.NAME``):
whether it reaches an address and port, it holding planned ports open for another node to
reach, and which interface and transports NIXL's UCX will use for an address there.

The pre-flight check ``node.reach`` (console/checks/reach.py) asks them; the agent
(``manage.py agent``) answers, being a Celery worker on that queue.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from kombu.exceptions import OperationalError

from console.celery import app
from inference.net_devices import rdma_ports, ucx_net_devices

# An agent that has not answered in this long is reported as silent: the check does not wait
# on a node that may be down.
ANSWER_TIMEOUT_S = 5.0


# The ports this agent listens on for a check, so that a second check meanwhile (a save, then
# a start) finds them its own rather than taken.
_HELD: dict[tuple[str, int], socket.socket] = {}
_HELD_LOCK = threading.Lock()


class AgentSilent(Exception):
    """The node's agent did not answer in time, or its queue could not be written."""


def queue_name(node_name: str) -> str:
    return f"node.{node_name}"


def ask(node_name: str, task: Any, *args: Any, timeout_s: float = ANSWER_TIMEOUT_S) -> Any:
    """Run ``task`` on ``node_name``'s agent and return its answer."""
    try:
        result = task.apply_async(args=list(args), queue=queue_name(node_name),
                                  expires=timeout_s)
        return result.get(timeout=timeout_s, disable_sync_subtasks=False)
    except (CeleryTimeout, OperationalError) as exc:
        raise AgentSilent(f"node {node_name}'s agent did not answer in {timeout_s:.0f} s "
                          f"({type(exc).__name__})") from exc


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


@app.task(name="agent.listen")
def listen(host: str, ports: list[int], seconds: float) -> dict[str, str]:
    """Listen on ``host`` at each of ``ports`` for ``seconds`` (in a thread: the agent's one
    worker slot is free again at once), so another node can probe them before the workers
    that will hold them exist. Returns port -> "" when listening, else why not."""
    sockets: list[tuple[tuple[str, int], socket.socket]] = []
    answer: dict[str, str] = {}
    for port in ports:
        with _HELD_LOCK:
            if (host, port) in _HELD:  # an earlier check's listener: this node's own
                answer[str(port)] = ""
                continue
        try:
            sock = socket.create_server((host, port))
        except OSError as exc:
            answer[str(port)] = exc.strerror or str(exc)
            continue
        with _HELD_LOCK:
            _HELD[(host, port)] = sock
        sockets.append(((host, port), sock))
        answer[str(port)] = ""

    def close_later() -> None:
        time.sleep(seconds)
        with _HELD_LOCK:
            for key, sock in sockets:
                sock.close()
                _HELD.pop(key, None)

    threading.Thread(target=close_later, name="agent-listen", daemon=True).start()
    return answer


@app.task(name="agent.network")
def network(address: str) -> dict[str, object]:
    """The interface UCX will use for ``address`` on this node, and its active RDMA ports."""
    return {"net_devices": ucx_net_devices(address, rdma=False), "rdma": rdma_ports()}
