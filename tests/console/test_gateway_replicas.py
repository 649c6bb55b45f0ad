"""Gateway replicas (PDSERVE_GATEWAY_REPLICAS) as the supervisor runs them: each on its own
port and slot, each told the configuration with its share of every deployment's in-flight
limit, each restarted on its own. Real gateway processes in front of a real router process and
a stand-in worker (no vLLM): one replica SIGKILLed while a client keeps sending through the
other loses no request and no usage, since the router behind both meters it.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from console.control.daemon import Supervisor
from console.deployments.models import Deployment, WorkerPlan
from console.gateway import gateway_process
from console.gateway.routes_config import gateway_config, replica_share
from console.gateway.services import create_key
from console.gateway.sync import KeySync
from console.gateway.traffic import live_queues
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port, wait_for

# Fixtures: the data directory in settings (autouse). The router and its stand-in worker are
# test_usage.py's: the worker answers with vLLM's usage, the router meters it in its ledger.
from tests.console.test_gateway import data_dir  # noqa: F401
from tests.console.test_usage import RealRouter, Worker, totals
from tests.console.tiny_models import make_plan, make_startable

OnCommit = Callable[..., Any]
REPLICAS = 2
CONCURRENCY = 5  # odd: each of two replicas holds 3, together 6


def consecutive_ports(count: int) -> int:
    """The first of ``count`` free ports in a row (replica i listens on the first + i)."""
    while True:
        first = free_port()
        if first + count - 1 > 65535:
            continue
        try:
            for port in range(first + 1, first + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


@pytest.fixture
def gateway_port(settings: Any) -> int:
    settings.PDSERVE_GATEWAY_PORT = consecutive_ports(REPLICAS)
    settings.PDSERVE_GATEWAY_REPLICAS = REPLICAS
    return int(settings.PDSERVE_GATEWAY_PORT)


@pytest.fixture
def supervisor(db: None, gateway_port: int, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=2.0)


@pytest.fixture
def metered(tmp_path: Path, data_dir: Path) -> Iterator[tuple[Deployment, RealRouter]]:  # noqa: F811
    """A colocated plan whose one worker is the stand-in and whose router runs on its ledger
    file. Not wanted running: the supervisor starts no worker or router of its own for it, and
    the gateway still routes to its ready router."""
    deployment = make_plan(tmp_path, name="metered", mode=Deployment.Mode.COLOCATED,
                           concurrency=CONCURRENCY)
    first, second = deployment.workers.order_by("pk")
    second.delete()
    WorkerPlan.objects.filter(pk=first.pk).update(role=WorkerPlan.Role.COLOCATED, index=0)
    deployment = make_startable(deployment)
    worker = Worker(deployment.workers.get().port)
    threading.Thread(target=worker.serve_forever, args=(0.05,), daemon=True).start()
    router = RealRouter(deployment, data_dir / "router.log")
    router.start()
    try:
        yield deployment, router
    finally:
        router.stop()
        worker.shutdown()
        worker.server_close()


def replica_rows() -> dict[str, ManagedProcess]:
    return {row.slot: row for row in ManagedProcess.objects.filter(kind=ManagedProcess.Kind.GATEWAY)}


def tick_until_all_ready(sup: Supervisor, why: str) -> dict[str, ManagedProcess]:
    def ready() -> bool:
        sup.tick()
        rows = replica_rows()
        return len(rows) == REPLICAS and all(row.state == ManagedProcess.State.READY
                                             for row in rows.values())
    wait_for(ready, why, timeout=60, interval=0.25)
    return replica_rows()


class Client:
    """Sends completions through one replica and counts what came back."""

    def __init__(self, port: int, model: str, secret: str) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.answered = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.failures: list[str] = []

    def send(self, prompt: str = "abab", max_tokens: int = 3) -> None:
        try:
            response = httpx.post(self.url, headers=self.headers, timeout=30, json={
                "model": self.model, "prompt": prompt, "max_tokens": max_tokens})
        except httpx.HTTPError as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return
        if response.status_code != 200:
            self.failures.append(f"{response.status_code} {response.text[:200]}")
            return
        self.answered += 1
        self.prompt_tokens += response.json()["usage"]["prompt_tokens"]
        self.completion_tokens += response.json()["usage"]["completion_tokens"]


def keep_sending(client: Client, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            client.send()
    thread = threading.Thread(target=loop, name="client", daemon=True)
    thread.start()
    return thread


def test_each_replica_holds_its_share_of_a_deployments_limit(
        db: None, settings: Any, tmp_path: Path) -> None:
    deployment = make_plan(tmp_path, concurrency=CONCURRENCY)
    settings.PDSERVE_GATEWAY_REPLICAS = 1
    one = next(d for d in gateway_config()["deployments"] if d["name"] == deployment.name)
    assert one["max_concurrency"] == CONCURRENCY  # one replica: the whole limit, as before
    settings.PDSERVE_GATEWAY_REPLICAS = 2
    two = next(d for d in gateway_config()["deployments"] if d["name"] == deployment.name)
    assert two["max_concurrency"] == 3
    # Rounded up: together the replicas never hold less than the plan's concurrency.
    assert [replica_share(limit, 4) for limit in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert [replica_share(8, replicas) for replicas in (1, 2, 3, 8, 9)] == [8, 4, 3, 1, 1]


def test_replica_slots_and_ports(settings: Any) -> None:
    settings.PDSERVE_GATEWAY_PORT = 8090
    settings.PDSERVE_GATEWAY_REPLICAS = 3
    # The first keeps the slot a single gateway always had: an upgraded supervisor adopts it.
    assert [gateway_process.slot(r) for r in gateway_process.replicas()] == [
        "gateway", "gateway-1", "gateway-2"]
    assert [gateway_process.url(r) for r in gateway_process.replicas()] == [
        "http://127.0.0.1:8090", "http://127.0.0.1:8091", "http://127.0.0.1:8092"]
    assert gateway_process.command(2)[gateway_process.command(2).index("--port") + 1] == "8092"
    settings.PDSERVE_GATEWAY_PORT = 65534
    with pytest.raises(ImproperlyConfigured, match="replica 2 would listen on port 65536"):
        gateway_process.command(2)


def test_two_replicas_serve_and_a_killed_one_loses_no_usage(
        supervisor: Supervisor, metered: tuple[Deployment, RealRouter], gateway_port: int,
        owner: User, api: APIClient, django_capture_on_commit_callbacks: OnCommit) -> None:
    deployment, _router = metered
    rows = tick_until_all_ready(supervisor, "both gateway replicas to start")
    assert {slot: (row.port, row.role, row.deployment_id) for slot, row in rows.items()} == {
        "gateway": (gateway_port, "gateway", None),
        "gateway-1": (gateway_port + 1, "gateway", None)}

    with django_capture_on_commit_callbacks(execute=True):
        key, secret = create_key(name="k", team=deployment.team, deployments=[deployment],
                                 all_deployments=False, limits={}, user=owner)
    # Pushed to both as the key committed; each holds half the deployment's limit, rounded up.
    wanted = gateway_config()["version"]
    assert [gateway_process.running_version(r) for r in range(REPLICAS)] == [wanted, wanted]
    queues, unreadable = live_queues()
    assert unreadable == [] and queues[deployment.name].limit == 2 * 3
    assert api.get("/api/v1/gateway/traffic/").json()["gateway"] == "running"

    first = Client(gateway_port, deployment.served_model_name, secret)
    second = Client(gateway_port + 1, deployment.served_model_name, secret)
    for _ in range(5):
        first.send()
        second.send()
    assert (first.answered, second.answered) == (5, 5), first.failures + second.failures

    # SIGKILL the first replica while a client keeps sending through the second.
    stop = threading.Event()
    sender = keep_sending(second, stop)
    try:
        wait_for(lambda: second.answered >= 15, "requests through the second replica")
        os.kill(rows["gateway"].pid, signal.SIGKILL)
        during = second.answered

        def restarted() -> bool:
            supervisor.tick()
            row = replica_rows()["gateway"]
            return (row.pid not in (None, rows["gateway"].pid)
                    and row.state == ManagedProcess.State.READY)
        wait_for(restarted, "the killed replica to be started again", timeout=60, interval=0.25)
        assert second.answered > during  # the other kept serving meanwhile
        again = replica_rows()
        assert again["gateway"].restarts == rows["gateway"].restarts + 1
        assert again["gateway-1"].pid == rows["gateway-1"].pid  # untouched
        # Started on its file: the configuration of now, the key included.
        assert gateway_process.running_version(0) == gateway_config()["version"]
        for _ in range(5):
            first.send()
    finally:
        stop.set()
        sender.join(timeout=30)
    assert first.failures == [] and second.failures == [], first.failures + second.failures

    # The router behind both metered every request the clients saw answered, once.
    assert KeySync().sync_once() == 1
    counted = totals()[str(key.pk)]
    answered = first.answered + second.answered
    print(f"usage after the kill: client answered {answered} "
          f"({first.answered} via the killed replica, {second.answered} via the other); "
          f"the router's ledger counted {counted.requests}")
    assert (counted.requests, counted.errors) == (answered, 0)
    assert (counted.prompt_tokens, counted.completion_tokens) == (
        first.prompt_tokens + second.prompt_tokens,
        first.completion_tokens + second.completion_tokens)


def test_a_next_supervisor_adopts_every_replica_and_stops_one_no_longer_wanted(
        supervisor: Supervisor, settings: Any, tmp_path: Path) -> None:
    rows = tick_until_all_ready(supervisor, "both gateway replicas to start")
    # The supervisor dies (its children outlive it); the next one takes both over.
    supervisor.children.clear()
    supervisor.http.close()
    following = Supervisor(log_dir=tmp_path / "logs")
    try:
        assert following.recover() == REPLICAS
        following.tick()
        assert {slot: row.pid for slot, row in replica_rows().items()} == {
            slot: row.pid for slot, row in rows.items()}
        assert sorted(child.slot for child in following.children.values()) == [
            "gateway", "gateway-1"]

        settings.PDSERVE_GATEWAY_REPLICAS = 1

        def one_left() -> bool:
            following.tick()
            now = replica_rows()
            return (now["gateway"].state == ManagedProcess.State.READY
                    and now["gateway-1"].state == ManagedProcess.State.STOPPED)
        wait_for(one_left, "the second replica to stop", timeout=30, interval=0.25)
        assert replica_rows()["gateway"].pid == rows["gateway"].pid
    finally:
        following.stop_all(grace_s=2.0)
