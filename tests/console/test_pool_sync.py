"""A running plan that gains or loses a worker changes its router's pool through the router's
admin API, with a real router process: no restart, and a removed worker is stopped only after
the requests it has in flight finished. A router that stalls (stopped with SIGSTOP, so its admin
API times out) leaves the removed worker running: unknown is not drained."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from console.control.pools import PoolSync
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import admin_token
from console.supervisor.models import ManagedProcess
from tests.console.router_process import router_process
from tests.console.sockets import wait_for
from tests.console.tiny_models import make_plan

pytestmark = pytest.mark.django_db(transaction=True)

class Worker(ThreadingHTTPServer):
    """Stands in for a vLLM worker: healthy, and answers completions after ``hold_s``."""

    def __init__(self, port: int, name: str, hold_s: float = 0.0):
        self.name = name
        self.hold_s = hold_s
        self.answered = 0
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Worker

    def log_message(self, *_args: object) -> None:
        return None

    def _json(self, body: dict[str, object]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._json({})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.server.hold_s)
        self.server.answered += 1
        self._json({"id": "x", "object": "text_completion", "model": "tiny",
                    "choices": [{"index": 0, "text": self.server.name, "finish_reason": "length"}]})


@pytest.fixture
def colocated(tmp_path: Path) -> Iterator[tuple[Deployment, list[Worker]]]:
    deployment = make_plan(tmp_path, mode=Deployment.Mode.COLOCATED,
                           desired_state=Deployment.DesiredState.RUNNING)
    first, second = deployment.workers.order_by("pk")
    for index, worker in enumerate((first, second)):
        WorkerPlan.objects.filter(pk=worker.pk).update(role=WorkerPlan.Role.COLOCATED, index=index)
    first, second = deployment.workers.order_by("index")
    workers = [Worker(w.port, w.slot, hold_s=1.5) for w in (first, second)]
    for worker in workers:
        threading.Thread(target=worker.serve_forever, daemon=True).start()
    for plan in (first, second):
        ManagedProcess.objects.create(deployment=deployment, slot=plan.slot, role=plan.role,
                                      port=plan.port, state=ManagedProcess.State.READY,
                                      log_path=str(tmp_path / f"{plan.slot}.log"))
    # The router starts with the first worker only, as if the second came with a plan change.
    try:
        with router_process(deployment, first.variant.path, [first.url], tmp_path,
                            timeout_s=60):
            yield deployment, workers
    finally:
        for worker in workers:
            worker.shutdown()
            worker.server_close()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def members(deployment: Deployment) -> dict[str, str]:
    response = httpx.get(f"{deployment.router_url}/admin/backends", timeout=5,
                         headers={"Authorization": f"Bearer {admin_token(deployment)}"})
    assert response.status_code == 200
    return {b["url"]: b["state"] for b in response.json()["roles"]["colocated"]["backends"]}


def test_a_ready_planned_worker_joins_the_router_and_a_removed_one_drains_first(
        colocated: tuple[Deployment, list[Worker]]) -> None:
    deployment, workers = colocated
    first, second = deployment.workers.order_by("index")
    pools = PoolSync(sync_every_s=0)
    assert set(members(deployment)) == {first.url}

    assert pools.step()
    wait_for(lambda: members(deployment) == {first.url: "ready", second.url: "ready"},
             "the second worker in the pool")
    assert not pools.step()  # nothing left to add

    # Two requests at once: least outstanding puts one on each worker.
    results: list[httpx.Response] = []

    def send() -> None:
        results.append(httpx.post(f"{deployment.router_url}/v1/completions", timeout=30,
                                  json={"model": "tiny", "prompt": "ab", "max_tokens": 2}))

    clients = [threading.Thread(target=send) for _ in range(2)]
    for client in clients:
        client.start()
    wait_for(lambda: workers[1].answered == 0 and _in_flight(deployment, second.url) == 1,
             "a request in flight on the second worker")

    # The second worker leaves the plan while its request is in flight.
    second.delete()
    assert not pools.drained(deployment, "colocated", second.url)  # drain requested
    assert members(deployment)[second.url] == "draining"
    assert not pools.drained(deployment, "colocated", second.url)  # still busy
    for client in clients:
        client.join(timeout=30)
    assert [r.status_code for r in results] == [200, 200]
    assert workers[1].answered == 1  # the in-flight request finished on the leaving worker
    wait_for(lambda: pools.drained(deployment, "colocated", second.url), "the drain to end")
    assert set(members(deployment)) == {first.url}


def _in_flight(deployment: Deployment, url: str) -> int:
    response = httpx.get(f"{deployment.router_url}/health", timeout=5)
    backends = response.json()["roles"]["colocated"]["backends"]
    return next((b["in_flight"] for b in backends if b["url"] == url), 0)


@contextlib.contextmanager
def stalled(deployment: Deployment) -> Iterator[None]:
    """The deployment's router process stopped (SIGSTOP): the kernel still accepts connections
    on its port, but nothing answers, so every admin call times out, as on a router too busy to
    answer in time."""
    pid = deployment.processes.get(slot="router").pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _in_flight_on_second(deployment: Deployment, workers: list[Worker], pools: PoolSync,
                         hold_s: float) -> tuple[WorkerPlan, list[threading.Thread],
                                                 list[httpx.Response]]:
    """Both workers in the pool and a request in flight on each; the second worker's answer
    takes ``hold_s``."""
    first, second = deployment.workers.order_by("index")
    assert pools.step()
    wait_for(lambda: members(deployment) == {first.url: "ready", second.url: "ready"},
             "the second worker in the pool")
    for worker in workers:
        worker.hold_s = hold_s
    results: list[httpx.Response] = []

    def send() -> None:
        results.append(httpx.post(f"{deployment.router_url}/v1/completions", timeout=30,
                                  json={"model": "tiny", "prompt": "ab", "max_tokens": 2}))

    clients = [threading.Thread(target=send) for _ in range(2)]
    for client in clients:
        client.start()
    wait_for(lambda: workers[1].answered == 0 and _in_flight(deployment, second.url) == 1,
             "a request in flight on the second worker")
    return second, clients, results


def test_a_removed_worker_is_not_drained_while_its_router_does_not_answer(
        colocated: tuple[Deployment, list[Worker]], caplog: pytest.LogCaptureFixture) -> None:
    deployment, workers = colocated
    pools = PoolSync(sync_every_s=0, admin_timeout_s=0.5)
    second, clients, results = _in_flight_on_second(deployment, workers, pools, hold_s=3.0)
    url = second.url
    second.delete()

    with caplog.at_level(logging.WARNING, "pdserve.supervisor"), stalled(deployment):
        started = time.monotonic()
        assert not pools.drained(deployment, "colocated", url)  # unknown: keeps running
        assert not pools.drained(deployment, "colocated", url)  # asked again: still unknown
        assert time.monotonic() - started >= 2 * 0.5  # both calls really waited for the router
        assert not pools.step()  # adds nothing while the pools are unknown
    assert f"cannot read whether {url} is drained (GET /admin/backends: ReadTimeout" in caplog.text
    assert "router admin API unreadable (GET /admin/backends: ReadTimeout" in caplog.text
    assert workers[1].answered == 0  # its request is still in flight

    # The router answers again: the drain goes on as if nothing had happened.
    assert not pools.drained(deployment, "colocated", url)  # drain requested now
    assert members(deployment)[url] == "draining"
    assert not pools.drained(deployment, "colocated", url)  # still busy
    for client in clients:
        client.join(timeout=30)
    assert [r.status_code for r in results] == [200, 200]
    assert workers[1].answered == 1  # the in-flight request finished on the leaving worker
    wait_for(lambda: pools.drained(deployment, "colocated", url), "the drain to end")
    assert set(members(deployment)) == {deployment.workers.get().url}
    assert "stopping" not in caplog.text


def test_a_removed_worker_whose_router_stays_unreadable_is_stopped_at_the_drain_limit(
        colocated: tuple[Deployment, list[Worker]], caplog: pytest.LogCaptureFixture) -> None:
    deployment, workers = colocated
    pools = PoolSync(sync_every_s=0, admin_timeout_s=0.3, drain_limit_s=1.5)
    second, clients, _results = _in_flight_on_second(deployment, workers, pools, hold_s=3.0)
    url = second.url
    second.delete()

    # (when the call began, when it answered, drained): a "not yet" was decided between the two,
    # so it began before the limit; a "stopped" answered after it. Both hold however late a
    # loaded machine schedules the call.
    answers: list[tuple[float, float, bool]] = []
    with caplog.at_level(logging.WARNING, "pdserve.supervisor"), stalled(deployment):
        started = time.monotonic()
        while not answers or not answers[-1][2]:
            assert time.monotonic() - started < 10, "never stopped"
            began = time.monotonic() - started
            drained = pools.drained(deployment, "colocated", url)
            answers.append((began, time.monotonic() - started, drained))
    # Kept running on every read until the limit, then stopped once, saying why.
    assert all(not drained for _b, _a, drained in answers[:-1]) and len(answers) > 2
    assert answers[-2][0] <= 1.5 + 0.3 + 0.1 and answers[-1][1] > 1.5
    assert workers[1].answered == 0  # stopped with its request still in flight: the limit
    line = re.search(r"router admin API unreadable for (\d+) s \(last error: GET /admin/backends: "
                     r"ReadTimeout: [^)]*\); stopping (\S+) anyway", caplog.text)
    assert line is not None, caplog.text
    assert int(line[1]) in (1, 2, 3) and line[2] == url
    assert pools.draining == {}
    for client in clients:
        client.join(timeout=30)
