"""``manage.py agent --node NAME``: a node's agent, a Celery worker on the node's queue that
hosts the node's supervisor.

The supervisor runs, watches and restarts the workers the plans place on this node; the
console's own node is ``manage.py supervise``'s. The agent reports through Redis: a heartbeat
with its process table and devices (console/fleet/agent_liveness.py), and, as every supervisor
does, log lines (stored first) and metrics over the shared channel layer.

Fencing: an agent that loses Redis keeps its workers serving and catches up once Redis is back;
an agent that stops (SIGTERM) or dies leaves its workers running, and the next agent on the
node adopts them, by pid and start time: never a duplicate, never an orphan.
"""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.catalog import copies  # noqa: F401 - registers the agent's verification task
from console.celery import app
from console.control.agent_loops import HeartbeatSender, SupervisorLoop
from console.control.daemon import Supervisor
from console.fleet import agent_calls, agent_liveness, secret_fingerprint
from console.fleet.agent_liveness import Heartbeat
from console.fleet.models import Node, NodeAgent
from console.supervisor.models import ManagedProcess


class Command(BaseCommand):
    help = ("Run this node's agent: a Celery worker on the node's queue (node.NAME) hosting the "
            "supervisor of the workers the plans place on this node. Needs REDIS_URL and the "
            "console's database (DATABASE_URL).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--node", required=True,
                            help="this node's name, as added to the console's fleet")
        parser.add_argument("--status", action="store_true",
                            help="print the node's agent state, last heartbeat and process "
                                 "table, and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        node = self._node(options["node"])
        if options["status"]:
            self._print_status(node)
            return
        if not settings.REDIS_URL:
            raise CommandError("REDIS_URL is not set: a node agent reports and takes its orders "
                               "through Redis (set REDIS_URL to the console's Redis)")
        try:
            differs = secret_fingerprint.mismatch(agent_liveness.redis_client())
        except redis.RedisError as exc:
            # Redis may come later (the agent outlives its absence); the workers' 401s would
            # then be the sign of a wrong secret.
            self.stdout.write(f"agent {node.name}: could not compare the secret key with the "
                              f"console's ({exc}); starting unchecked")
            differs = None
        if differs:
            raise CommandError(differs)
        lock_path = Path(settings.DATA_DIR) / f"agent-{node.name}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "w")  # noqa: SIM115 - held for the agent's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise CommandError(f"--node {node.name}: another agent holds {lock_path}") from exc

        supervisor = Supervisor(node_id=node.pk)
        adopted = supervisor.recover()
        self.stdout.write(f"agent {node.name}: settled {adopted} process record(s) a previous "
                          "agent left (running workers adopted)")
        beats = HeartbeatSender(node, supervisor)
        beats.register()
        # Metrics: the console's collector scrapes this node's workers over the network, and
        # reads their CPU and memory from the heartbeat.
        supervisor.start_log_writer()
        beats.start()
        loop = SupervisorLoop(supervisor)
        loop.start()
        self.stdout.write(f"agent {node.name}: running, queue {agent_calls.queue_name(node.name)}")
        self.stdout.flush()
        try:
            # Fencing: Redis going away must not end the agent (Celery gives up after 100
            # retries otherwise); its supervisor goes on meanwhile.
            app.conf.broker_connection_max_retries = None
            worker = app.Worker(
                queues=[agent_calls.queue_name(node.name)], pool="solo", concurrency=1,
                hostname=f"agent@{node.name}", loglevel="WARNING", quiet=True,
                without_gossip=True, without_mingle=True)
            worker.start()
        finally:
            loop.stop()
            beats.stop()
            # Workers are left running: the next agent on this node adopts them.
            supervisor.stop_log_writer()
            left = len(supervisor.children)
            self.stdout.write(f"agent {node.name}: stopped; {left} process(es) left running "
                              "for the next agent to adopt")
            lock.close()

    def _node(self, name: str) -> Node:
        node = Node.objects.filter(name=name).first()
        if node is None:
            known = ", ".join(Node.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"--node {name}: no such node in the console's fleet (known: "
                               f"{known}); add it first, with its address")
        if node.is_local:
            raise CommandError(f"--node {name}: this is the console's own node, which "
                               "`manage.py supervise` runs")
        # Plans are read against the console's node; an agent must never record this machine
        # in its place (console/fleet/services.py records the local node where it is missing).
        if Node.objects.local() is None:
            raise CommandError("the console has not recorded its own node yet: start the "
                               "console (`manage.py supervise` or `make up`) first")
        return node

    def _print_status(self, node: Node) -> None:
        agent = NodeAgent.objects.filter(node=node).first()
        if agent is None:
            self.stdout.write(f"node {node.name} ({node.address}): no agent has run here")
        else:
            self.stdout.write(f"node {node.name} ({node.address}): agent {agent.state} since "
                              f"{agent.state_since:%Y-%m-%d %H:%M:%S}, "
                              f"{self._last_heartbeat(node, agent)}")

        rows = ManagedProcess.objects.filter(node=node).select_related("deployment")
        if not rows:
            self.stdout.write("no processes")
        for row in rows:
            self.stdout.write(
                f"{row.owner_name:20} {row.slot:20} {row.state:9} pid={row.pid or '-':<7} "
                f"{row.host}:{row.port or '-'} restarts={row.restarts} {row.last_error[:80]}")


    @staticmethod
    def _last_heartbeat(node: Node, agent: NodeAgent) -> str:
        """The heartbeat in Redis as the agent wrote it, else the one the judge last stored."""
        beat: Heartbeat | None = None
        if settings.REDIS_URL:
            try:
                beat = agent_liveness.read_all(agent_liveness.redis_client(), [node.name]).get(
                    node.name)
            except redis.RedisError as exc:
                return f"Redis unreachable ({exc}); judged {agent.state}"
        if beat is None and agent.heartbeat:
            beat = Heartbeat.from_json(json.dumps(agent.heartbeat))
        if beat is None:
            return "no heartbeat"
        age = f"{max(0.0, time.time() - beat.sent_at):.1f} s ago" if beat.sent_at else "at an unknown time"
        return (f"last heartbeat {age} (the agent's clock), #{beat.seq} from pid {beat.pid} on "
                f"{beat.hostname}, {len(beat.processes)} process(es)")
