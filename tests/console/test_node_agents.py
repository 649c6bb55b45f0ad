"""Node agents: the judge of their heartbeats (through the real Redis at 127.0.0.1:6379), the
supervisor's scope to its node (adoption included), the control messages on a node's queue,
and ``manage.py agent``'s refusals and status.

The agent process itself, across network namespaces with real vLLM workers, is
tests/e2e/test_two_nodes.py's.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from console.alerts.evaluation import Evaluator
from console.alerts.models import Alert, AlertState, Fact
from console.audit.models import AuditEntry
from console.celery import app
from console.control.agent_tasks import notify_agents
from console.control.daemon import Supervisor
from console.control.worker_specs import ProcessSpec
from console.deployments.models import Deployment
from console.fleet import agent_liveness, secret_fingerprint
from console.fleet.agent_calls import listen, probe, queue_name
from console.fleet.agent_liveness import Heartbeat, NodeMonitor, judge
from console.fleet.models import Node, NodeAgent
from console.live.collector import MetricsCollector, ScrapeTarget
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port

REDIS = "redis://127.0.0.1:6379/0"
GRACE_S = 30.0


@pytest.fixture
def edge(db: None) -> Iterator[Node]:
    # Unique: the console suite runs on SQLite and PostgreSQL at once against one Redis.
    node = Node.objects.create(name=f"edge-{uuid.uuid4().hex[:8]}", address="127.0.0.1",
                               cpu_ids=[0, 1], memory_bytes=8 << 30)
    yield node
    redis.Redis.from_url(REDIS).delete(agent_liveness.heartbeat_key(node.name))


def beat(node: Node, seq: int) -> Heartbeat:
    heartbeat = Heartbeat(node=node.name, seq=seq, pid=os.getpid(), hostname="test",
                          started_at=0.0, sent_at=time.time(), processes={"d/decode-0": "ready"})
    agent_liveness.publish(redis.Redis.from_url(REDIS), heartbeat, GRACE_S)
    return heartbeat


def agent_state(node: Node) -> str:
    return NodeAgent.objects.get(node=node).state


# ---- the judge ------------------------------------------------------------------------------


def test_judge_keeps_a_node_up_through_its_grace() -> None:
    assert judge(0.0, GRACE_S) == NodeAgent.State.UP
    assert judge(GRACE_S, GRACE_S) == NodeAgent.State.UP
    assert judge(GRACE_S + 0.1, GRACE_S) == NodeAgent.State.DOWN


def test_a_silent_agent_is_marked_down_after_the_grace_and_up_at_its_next_beat(
        edge: Node) -> None:
    agent_liveness.register(edge, beat(edge, 1))
    monitor = NodeMonitor(grace_s=GRACE_S, url=REDIS)
    assert [(j.node, j.state) for j in monitor.step(now=100.0)] == [(edge.name, "up")]
    beat(edge, 2)
    monitor.step(now=105.0)
    # A blip of 25 s without a heartbeat (a Redis restart, a lost packet or two) marks nothing.
    assert monitor.step(now=130.0)[0].state == "up"
    assert agent_state(edge) == "up"
    judged = monitor.step(now=135.5)[0]
    assert (judged.state, judged.age_s) == ("down", 30.5)
    assert agent_state(edge) == "down"
    down = AuditEntry.objects.get(action="node.agent_down")
    assert down.actor == AuditEntry.Actor.SYSTEM
    assert down.object_repr == edge.name
    beat(edge, 3)
    assert monitor.step(now=200.0)[0].state == "up"
    stored = NodeAgent.objects.get(node=edge)
    assert stored.state == "up" and stored.heartbeat["seq"] == 3
    assert AuditEntry.objects.filter(action="node.agent_up").count() == 2  # register, return


def test_a_judge_that_cannot_read_redis_judges_nothing_then_gives_a_whole_grace(
        edge: Node) -> None:
    agent_liveness.register(edge, beat(edge, 1))
    monitor = NodeMonitor(grace_s=GRACE_S, url=REDIS)
    monitor.step(now=0.0)
    monitor.url, monitor._client = "redis://127.0.0.1:1/0", None  # nothing listens on port 1
    assert monitor.step(now=100.0) == []
    assert monitor.blind and agent_state(edge) == "up"
    monitor.url, monitor._client = REDIS, None
    # The heartbeat is 100 s old, but the judge was blind: the node gets a grace from now.
    assert monitor.step(now=110.0)[0].state == "up"
    assert monitor.step(now=139.0)[0].state == "up"
    assert monitor.step(now=141.0)[0].state == "down"


def test_a_down_node_fires_node_down_for_the_deployments_placed_on_it(
        deployment: Deployment, edge: Node) -> None:
    deployment.workers.filter(role="decode").update(node=edge)
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    agent_liveness.register(edge, beat(edge, 1))
    monitor = NodeMonitor(grace_s=GRACE_S, url=REDIS)
    evaluator = Evaluator(holder="a", nodes=monitor)
    evaluator.tick()  # takes the lease: the judge watches the node from now
    assert agent_state(edge) == "up"
    # As if its last new heartbeat had come 100 s ago (on the judge's clock).
    monitor.watches[edge.name].heard_at = time.monotonic() - 100
    evaluator.tick()
    assert agent_state(edge) == "down"
    assert Fact.objects.get(deployment=deployment, series="deployment.node_down").value == 1.0
    evaluator.tick()
    alert = Alert.objects.get(rule__deployment=deployment, rule__key="node_down")
    assert alert.state == AlertState.FIRING
    assert alert.value == 1.0


# ---- the supervisor's node ------------------------------------------------------------------


def _spec(slot: str, node: Node | None) -> ProcessSpec:
    return ProcessSpec(slot=slot, role=slot.split("-")[0], port=free_port(), argv=["true"],
                       node_id=node.pk if node else None)


def test_workers_of_a_node_with_an_agent_are_its_agents_alone(db: None, edge: Node,
                                                               tmp_path: Path) -> None:
    handmade = Node.objects.create(name=f"plain-{uuid.uuid4().hex[:6]}", address="127.0.0.1")
    console = Supervisor(log_dir=tmp_path)
    console.reconcile()  # reads which nodes have agents: none yet
    assert console.runs(_spec("decode-0", edge)) and console.runs(_spec("router", None))
    agent_liveness.register(edge, beat(edge, 1))
    console.reconcile()
    # Once a node has had an agent, even a down one, the console never starts its workers.
    assert not console.runs(_spec("decode-0", edge))
    assert console.runs(_spec("prefill-0", handmade)) and console.runs(_spec("router", None))
    agent = Supervisor(log_dir=tmp_path, node_id=edge.pk)
    assert agent.runs(_spec("decode-0", edge))
    assert not agent.runs(_spec("prefill-0", handmade)) and not agent.runs(_spec("router", None))


def test_an_agent_adopts_its_nodes_running_workers_and_leaves_the_others_alone(
        deployment: Deployment, edge: Node, tmp_path: Path) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 start_new_session=True) for _ in range(2)]
    try:
        rows = {}
        for slot, node, proc in (("decode-0", edge, sleepers[0]), ("prefill-0", None, sleepers[1])):
            rows[slot] = ManagedProcess.objects.create(
                deployment=deployment, slot=slot, role=slot.split("-")[0], node=node,
                port=free_port(), pid=proc.pid, state=ManagedProcess.State.READY,
                log_path=str(tmp_path / f"{slot}.log"),
                started_at=timezone.make_aware(
                    timezone.datetime.fromtimestamp(psutil.Process(proc.pid).create_time())))
        agent = Supervisor(log_dir=tmp_path, node_id=edge.pk)
        assert agent.recover() == 1
        assert [c.slot for c in agent.children.values()] == ["decode-0"]
        assert agent.children[rows["decode-0"].pk].popen.pid == sleepers[0].pid
        # The console's row was neither adopted nor failed by the agent.
        assert ManagedProcess.objects.get(pk=rows["prefill-0"].pk).state == "ready"
        assert sleepers[1].poll() is None
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()


# ---- control messages and probes ------------------------------------------------------------


def test_a_start_messages_the_agents_of_the_nodes_it_runs_on(deployment: Deployment,
                                                             edge: Node) -> None:
    assert notify_agents(deployment, "start") == []  # no agent anywhere: nothing sent
    deployment.workers.filter(role="decode").update(node=edge)
    agent_liveness.register(edge, beat(edge, 1))
    assert notify_agents(deployment, "start") == [queue_name(edge.name)]
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name(edge.name))
        message = queue.get(timeout=5)
        assert message.headers["task"] == "agent.control"
        assert list(message.payload[0]) == ["start", deployment.name]
        message.ack()
        queue.close()


def test_a_probe_reaches_ports_a_node_holds_open_for_a_while_and_not_after() -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        # The console suite runs on two databases at once, and the other run's connections take
        # ephemeral ports too: a port free a moment ago can be taken before the check binds it
        # (seen in CI), so a port found in use is drawn again, a few times: a check that never
        # finds a free port free still fails below.
        for _ in range(5):
            free = free_port()
            answer = listen.run("127.0.0.1", [free, taken.getsockname()[1]], 1.0)
            if answer[str(free)] == "":
                break
        assert answer[str(free)] == ""
        assert "in use" in answer[str(taken.getsockname()[1])]
        # A second check meanwhile (a save, then a start) finds the port this node's own.
        assert listen.run("127.0.0.1", [free], 1.0) == {str(free): ""}
        opened = probe.run("127.0.0.1", free, 1.0)
        assert opened["ok"] is True and opened["error"] == ""
        time.sleep(1.5)  # the listener closes after its seconds
        closed = probe.run("127.0.0.1", free, 1.0)
        assert closed["ok"] is False and "refused" in str(closed["error"]).lower()
    finally:
        taken.close()


# ---- the command ----------------------------------------------------------------------------


def test_agent_refuses_an_unknown_node_the_consoles_own_and_no_redis(
        db: None, edge: Node, settings: object) -> None:
    with pytest.raises(CommandError, match=r"--node nowhere: no such node"):
        call_command("agent", "--node", "nowhere")
    local = Node.objects.local() or Node.objects.create(name="here", address="127.0.0.1",
                                                         is_local=True)
    with pytest.raises(CommandError, match="the console's own node"):
        call_command("agent", "--node", local.name)
    settings.REDIS_URL = ""  # type: ignore[attr-defined]
    with pytest.raises(CommandError, match="REDIS_URL is not set"):
        call_command("agent", "--node", edge.name)


def test_agent_refuses_a_secret_key_other_than_the_consoles(
        db: None, edge: Node, settings: object, monkeypatch: pytest.MonkeyPatch) -> None:
    # A key of this test's own: the console suite runs on two databases at once on one Redis.
    monkeypatch.setattr(secret_fingerprint, "KEY", f"pdserve:test-fingerprint:{uuid.uuid4()}")
    client = redis.Redis.from_url(REDIS)
    settings.REDIS_URL = REDIS  # type: ignore[attr-defined]
    Node.objects.local() or Node.objects.create(name="here", address="127.0.0.1", is_local=True)
    try:
        # No console has published: nothing to compare with, so nothing refused.
        assert secret_fingerprint.mismatch(client) is None
        secret_fingerprint.publish(client)
        assert secret_fingerprint.mismatch(client) is None
        settings.SECRET_KEY = "another secret of at least fifty characters, not the console's"  # type: ignore[attr-defined]
        assert "PDSERVE_SECRET_KEY differs" in (secret_fingerprint.mismatch(client) or "")
        with pytest.raises(CommandError, match="PDSERVE_SECRET_KEY differs from the console's"):
            call_command("agent", "--node", edge.name)
        # Refused before it took the node's lock or registered anything.
        assert not NodeAgent.objects.filter(node=edge).exists()
    finally:
        client.delete(secret_fingerprint.KEY)


def test_agent_status_names_the_state_the_last_heartbeat_and_the_processes(
        deployment: Deployment, edge: Node, settings: object) -> None:
    settings.REDIS_URL = REDIS  # type: ignore[attr-defined]  # read where the agent writes
    out = io.StringIO()
    call_command("agent", "--node", edge.name, "--status", stdout=out)
    assert out.getvalue().splitlines() == [
        f"node {edge.name} (127.0.0.1): no agent has run here", "no processes"]
    agent_liveness.register(edge, beat(edge, 4))
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                  node=edge, host="127.0.0.1", port=8200, pid=4242,
                                  state=ManagedProcess.State.READY, log_path="/dev/null")
    out = io.StringIO()
    call_command("agent", "--node", edge.name, "--status", stdout=out)
    head, row = out.getvalue().splitlines()
    assert head.startswith(f"node {edge.name} (127.0.0.1): agent up since ")
    assert f"#4 from pid {os.getpid()} on test, 1 process(es)" in head
    assert row.split()[:5] == [deployment.name, "decode-0", "ready", "pid=4242", "127.0.0.1:8200"]


def test_the_consoles_collector_reads_another_nodes_cpu_and_memory_from_its_heartbeat(
        deployment: Deployment, edge: Node, settings: object) -> None:
    settings.REDIS_URL = REDIS  # type: ignore[attr-defined]
    row = ManagedProcess.objects.create(
        deployment=deployment, slot="decode-0", role="decode", node=edge, host="127.0.0.1",
        port=free_port(), pid=1, state=ManagedProcess.State.READY, log_path="/dev/null")
    heartbeat = Heartbeat(node=edge.name, seq=1, pid=os.getpid(), hostname="test",
                          started_at=0.0, sent_at=time.time(),
                          resources={str(row.pk): {"cpu": 12.5, "rss": 1234}})
    agent_liveness.publish(redis.Redis.from_url(REDIS), heartbeat, GRACE_S)
    # pid 1 is this machine's init: were the pid read here, its own CPU and memory would show.
    collector = MetricsCollector(lambda: [ScrapeTarget(row.pk, 1, node=edge.name)])
    [sample] = collector.collect_once()
    entry = sample.data["processes"]["decode-0"]
    assert (entry["cpu"], entry["rss"], entry["up"]) == (12.5, 1234, 0)
