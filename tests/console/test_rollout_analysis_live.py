"""A green slower to its first token than blue rolls back on its own: the runner drives a real
router process (its revision groups, weights and per-revision histograms) in front of two
stand-in workers that stream answers, blue's at once and green's after a delay. The analysis
windows read the router's /metrics, find green's TTFT p95 beyond the limit relative to blue,
and the rollout rolls back: green's weight goes to 0 and its group is drained and removed.

The stand-ins are the one part not real here, so that the delay is certain; the live rollout
test (tests/e2e/test_rollouts_live.py) runs the machine against real vLLM workers."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from console.control.rollout_runner import RolloutRunner
from console.control.worker_specs import green_slot
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.router_admin import admin_token
from console.rollouts import revisions, services
from console.rollouts.models import Rollout
from console.supervisor.models import ManagedProcess
from tests.console.router_process import router_process
from tests.console.tiny_models import make_plan, make_startable, register

pytestmark = pytest.mark.django_db(transaction=True)

class Streamer(ThreadingHTTPServer):
    """Stands in for a vLLM worker: healthy, streams a completion's first chunk after
    ``first_s`` and three more 10 ms apart."""

    def __init__(self, port: int, first_s: float) -> None:
        self.first_s = first_s
        self.answered = 0
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Streamer
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: object) -> None:
        return None

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.answered += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        time.sleep(self.server.first_s)
        for _ in range(4):
            chunk = {"id": "x", "object": "text_completion", "model": "tiny",
                     "choices": [{"index": 0, "text": " x", "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def colocated(tmp_path: Path) -> Iterator[tuple[Deployment, list[Streamer]]]:
    deployment = make_plan(tmp_path, mode=Deployment.Mode.COLOCATED,
                           desired_state=Deployment.DesiredState.RUNNING)
    first, second = deployment.workers.order_by("pk")
    second.delete()
    WorkerPlan.objects.filter(pk=first.pk).update(role=WorkerPlan.Role.COLOCATED, index=0)
    deployment = make_startable(deployment)
    blue_worker = deployment.workers.get()
    revisions.ensure_live(deployment)
    blue = Streamer(blue_worker.port, first_s=0.01)
    servers = [blue]
    threading.Thread(target=blue.serve_forever, daemon=True).start()
    # Blue's stand-in runs in this process: the port checks then see blue's port held by blue.
    ManagedProcess.objects.create(deployment=deployment, slot=blue_worker.slot, role="colocated",
                                  port=blue_worker.port, state=ManagedProcess.State.READY,
                                  pid=os.getpid(), log_path=str(tmp_path / "colocated-0.log"))
    try:
        with router_process(deployment, blue_worker.variant.path, [blue_worker.url], tmp_path,
                            "--revision", "1"):
            yield deployment, servers
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def _green(rollout: Rollout, servers: list[Streamer], first_s: float, log_dir: Path) -> Streamer:
    """Green's stand-in on the port the rollout chose, its process row ready."""
    port = rollout.green_ports["colocated-0"]["port"]
    green = Streamer(port, first_s=first_s)
    servers.append(green)
    threading.Thread(target=green.serve_forever, daemon=True).start()
    ManagedProcess.objects.create(deployment=rollout.deployment,
                                  slot=green_slot("colocated-0", rollout.to_revision),
                                  role="colocated", port=port, state=ManagedProcess.State.READY,
                                  log_path=str(log_dir / "green.log"))
    return green


def test_a_green_slow_to_its_first_token_is_rolled_back_by_the_analysis(
        colocated: tuple[Deployment, list[Streamer]], tmp_path: Path) -> None:
    deployment, servers = colocated
    slow = register(deployment.base_model, tmp_path, "slow")
    draft, _ = revisions.create_draft(deployment, {"gate_mode": "off"}, {"colocated": slow}, None)
    rollout = services.start(deployment, draft, "canary", None,
                             steps=[{"weight": 50, "hold_s": 60}, {"weight": 100, "hold_s": 0}],
                             analysis={"interval_s": 1, "failure_limit": 0, "min_requests": 3,
                                       "metrics": {"ttft_p95": {"max_ratio": 3},
                                                   "error_rate": {"max": 0.0}}})
    green = _green(rollout, servers, first_s=0.3, log_dir=tmp_path)
    statuses: list[tuple[int, str]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                with http.stream("POST", f"{deployment.router_url}/v1/completions", json={
                        "model": "tiny", "prompt": "hello", "max_tokens": 4,
                        "stream": True}) as response:
                    response.read()
                    statuses.append((response.status_code,
                                     response.headers.get("X-Pdserve-Revision", "")))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    runner = RolloutRunner()
    try:
        deadline = time.monotonic() + 60
        while rollout.state not in Rollout.DONE_STATES:
            assert time.monotonic() < deadline, (rollout.state, rollout.reason)
            runner.step({})
            rollout.refresh_from_db()
            time.sleep(0.2)
        served_green = green.answered
        time.sleep(1)
        assert green.answered == served_green, "green served after its rollback"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert rollout.state == Rollout.State.ROLLED_BACK
    states = list(rollout.transitions.values_list("to_state", flat=True))
    assert states == ["starting", "stepping", "rolling_back", "rolled_back"], states
    assert "ttft_p95" in rollout.reason and "analysis failed" in rollout.reason, rollout.reason
    failed = rollout.analyses.filter(verdict="fail").first()
    assert failed is not None
    row = failed.metrics["ttft_p95"]
    assert row["green"] > 3 * row["blue"], row
    assert {status for status, _ in statuses} == {200}
    assert {revision for _, revision in statuses} == {"1", "2"}
    assert served_green > 0


def test_a_green_that_fails_its_gate_never_receives_a_request(
        colocated: tuple[Deployment, list[Streamer]], tmp_path: Path) -> None:
    """The gate's verdict is stored by its thread (the gate itself: tests/quality); from then
    on the machine alone decides: green's group never enters the router, and green's
    workers are drained and stopped."""
    deployment, servers = colocated
    other = register(deployment.base_model, tmp_path, "damaged")
    draft, _ = revisions.create_draft(deployment, {"gate_mode": "on"}, {"colocated": other}, None)
    rollout = services.start(deployment, draft, "canary", None)
    green = _green(rollout, servers, first_s=0.0, log_dir=tmp_path)
    runner = RolloutRunner()
    runner.step({})
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.GATING
    # What the gate's thread stores when green's answers differ from the reference's.
    Rollout.objects.filter(pk=rollout.pk).update(gate={
        "state": "failed", "report": {"reasons": ["colocated damaged: agreement 0.12 < 0.9"]}})
    answers = []
    for _ in range(20):
        response = httpx.post(f"{deployment.router_url}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": "hello", "max_tokens": 4, "stream": True})
        answers.append((response.status_code, response.headers["X-Pdserve-Revision"]))
        runner.step({})
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK, rollout.reason
    assert "output gate failed: colocated damaged" in rollout.reason
    assert answers == [(200, "1")] * 20
    assert green.answered == 0
    groups = httpx.get(f"{deployment.router_url}/admin/groups", timeout=5, headers={
        "Authorization": f"Bearer {admin_token(deployment)}"}).json()["groups"]
    assert [g["revision"] for g in groups] == ["1"]
    assert runner.specs(deployment) == []  # green's workers leave the reconcile: they stop
