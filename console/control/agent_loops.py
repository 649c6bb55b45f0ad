"""A node agent's two loops beside its Celery worker (``manage.py agent``): the supervisor's
ticks, woken early by control messages, and the heartbeat to Redis."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis
from django.conf import settings
from django.db import connection

from console.audit.actors import acting_as
from console.control import agent_tasks
from console.control.daemon import Supervisor
from console.fleet import agent_liveness
from console.fleet.agent_liveness import Heartbeat
from console.fleet.models import Node
from console.live.periodic import Periodic
from console.live.resources import TreeUsage
from console.supervisor.models import ManagedProcess

log = logging.getLogger("pdserve.agents")


class SupervisorLoop:
    """The supervisor's ticks, in a thread beside the Celery worker; a control message wakes it
    before its next tick."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-supervisor", daemon=True)

    def _run(self) -> None:
        try:
            with acting_as("system", "agent"):
                while not self._stop.is_set():
                    try:
                        self.supervisor.tick()
                    except Exception:  # a database blip must not end supervision
                        log.exception("a supervisor tick failed; retrying")
                    agent_tasks.WAKE.wait(settings.PDSERVE_SUPERVISOR_TICK_S)
                    agent_tasks.WAKE.clear()
        finally:
            connection.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        agent_tasks.WAKE.set()
        self._thread.join(timeout=30)


class HeartbeatSender:
    """Writes the node's heartbeat to Redis every ``PDSERVE_AGENT_HEARTBEAT_S``; a Redis that
    does not answer is logged once and retried at every beat, and nothing else stops."""

    def __init__(self, node: Node, supervisor: Supervisor) -> None:
        self.node = node
        self.supervisor = supervisor
        self.seq = 0
        self.started_at = time.time()
        self.failing = False
        self.usage = TreeUsage()
        self.client = agent_liveness.redis_client()
        self._loop = Periodic("agent-heartbeat", settings.PDSERVE_AGENT_HEARTBEAT_S, self.beat,
                              log, "an agent heartbeat failed; retrying")

    def heartbeat(self) -> Heartbeat:
        self.seq += 1
        node = Node.objects.get(pk=self.node.pk)
        rows = ManagedProcess.objects.filter(node=node).select_related("deployment")
        children = self.supervisor.children.copy()  # the supervisor's thread changes it
        resources = {str(c.record_id): self.usage.measure(c.popen.pid) for c in children.values()}
        self.usage.forget_unseen()
        return Heartbeat(
            node=node.name, seq=self.seq, pid=os.getpid(), hostname=socket.gethostname(),
            started_at=self.started_at, sent_at=time.time(),
            processes={f"{r.owner_name}/{r.slot}": r.state for r in rows},
            devices={"cpus": len(node.cpu_ids), "memory_bytes": node.memory_bytes,
                     "gpus": node.gpus.count(), "engine": f"{node.engine_package} "
                                                        f"{node.engine_version}".strip()},
            resources=resources)

    def register(self) -> None:
        heartbeat = self.heartbeat()
        agent_liveness.register(self.node, heartbeat)
        self._send(heartbeat)

    def beat(self) -> None:
        self._send(self.heartbeat())

    def _send(self, heartbeat: Heartbeat) -> None:
        try:
            agent_liveness.publish(self.client, heartbeat, settings.PDSERVE_AGENT_GRACE_S)
        except redis.RedisError as exc:
            if not self.failing:
                log.warning("agent %s: cannot reach Redis (%s); workers go on serving, "
                            "heartbeats resume when it answers", self.node.name, exc)
            self.failing = True
            return
        if self.failing:
            log.warning("agent %s: Redis answers again; heartbeats resumed", self.node.name)
        self.failing = False

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
