"""Alerts on a real deployment: the session's tiny-model 1P1D (tests/borrowed.py), its console's
supervisor running the evaluator and the delivery worker as ``make up`` does.

A decode worker killed with SIGKILL fires the ready-made "worker down" within 10 s and resolves
once the supervisor has restarted it; a real local HTTP receiver gets both notifications in
Alertmanager's webhook format (version 4). Then the same outage under a silence: the alert fires
and resolves, its history names the silence, and nothing is sent. The troubleshooting view names
both faults: the backend the router could not reach (symptom 1) and the worker that restarts
(symptom 8).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from inference.process_groups import kill_group
from tests.borrowed import NAME, Handle
from tests.e2e.doctor import wait_for_symptom
from tests.e2e.test_fault_matrix import BACK_TIMEOUT_S, _quiet, _wait, ready_again

pytestmark = pytest.mark.vllm

DETECT_WITHIN_S = 10.0


class Receiver:
    """An HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, status: str) -> list[dict[str, Any]]:
        return [body for body in self.bodies if body["status"] == status
                and body["commonLabels"].get("alertname") == "WorkerDown"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.server.shutdown()


def _worker_down(handle: Handle) -> Callable[[], dict[str, Any] | None]:
    def find() -> dict[str, Any] | None:
        alerts = handle.call("GET", "/api/v1/alerts/", params={
            "deployment": NAME, "state": "firing"}).json()["results"]
        return next((a for a in alerts if a["labels"].get("alertname") == "WorkerDown"
                     and a["labels"].get("process") == "decode-0"), None)
    return find


def _outage(handle: Handle) -> tuple[float, float]:
    """Kill decode-0; return (seconds to firing, seconds to resolved)."""
    decode = handle.processes()["decode-0"]
    firing = _worker_down(handle)
    kill_group(decode["pid"], signal.SIGKILL)
    killed = time.monotonic()
    _wait(_quiet(lambda: firing() is not None), "worker down firing", 30, interval_s=0.2)
    detection = time.monotonic() - killed
    _wait(ready_again(handle, "decode-0", decode["pid"]), "decode-0 restarted", BACK_TIMEOUT_S,
          interval_s=0.5)
    _wait(_quiet(lambda: firing() is None), "worker down resolved", 30, interval_s=0.2)
    return detection, time.monotonic() - killed


def test_worker_down_fires_notifies_resolves_and_a_silence_mutes_it(
        borrowed: Handle, receiver: Receiver) -> None:
    # The borrowed console has the one team its deployment is in.
    [team] = [t["name"] for t in borrowed.call("GET", "/api/v1/teams/").json()["results"]]
    notifier = borrowed.call("POST", "/api/v1/notifiers/", json={
        "team": team, "name": "receiver", "kind": "webhook", "url": receiver.url, "timeout_s": 5})
    assert notifier.status_code == 201, notifier.text
    try:
        detection, resolution = _outage(borrowed)
        assert detection <= DETECT_WITHIN_S, f"worker down fired {detection:.1f} s after the kill"
        _wait(lambda: bool(receiver.of("resolved")), "the resolved notification", 30)
        [fired] = receiver.of("firing")
        [resolved] = receiver.of("resolved")
        for body in (fired, resolved):
            assert body["version"] == "4" and body["receiver"] == "receiver"
            assert body["groupLabels"] == {"alertname": "WorkerDown", "deployment": NAME}
            assert body["groupKey"] == f'{{}}:{{alertname="WorkerDown", deployment="{NAME}"}}'
            [alert] = body["alerts"]
            assert alert["labels"]["process"] == "decode-0"
            assert alert["labels"]["severity"] == "critical"
            assert alert["generatorURL"].endswith(f"/alerts/{alert_id(borrowed)}/")
        assert fired["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
        assert resolved["alerts"][0]["status"] == "resolved"
        assert resolved["alerts"][0]["startsAt"] == fired["alerts"][0]["startsAt"]
        print(f"\nworker down: fired {detection:.1f} s after SIGKILL, resolved "
              f"{resolution:.1f} s after it (the supervisor's restart)")
        # The troubleshooting view names the outage (symptom 1) from the same observations.
        unreachable = wait_for_symptom(borrowed, "backend-unreachable", "backend-down",
                                       ("present", "suspected"))
        assert any("decode" in e["text"] for e in unreachable["evidence"]), unreachable

        now = datetime.now(UTC)
        silence = borrowed.call("POST", "/api/v1/silences/", json={
            "matchers": [{"name": "alertname", "op": "=", "value": "WorkerDown"},
                         {"name": "deployment", "op": "=", "value": NAME}],
            "starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat(),
            "comment": "planned restart", "team": team})
        assert silence.status_code == 201, silence.text
        sent_before = len(receiver.bodies)
        _outage(borrowed)
        time.sleep(3)  # a notification would have been sent by now (the worker polls each second)
        events = borrowed.call("GET", "/api/v1/alert-events/", params={
            "deployment": NAME}).json()["results"]
        history = [(e["at"], e["alert"]["labels"]["alertname"], e["from_state"], e["to_state"],
                    e["muted_by"]) for e in events]
        assert len(receiver.bodies) == sent_before, (receiver.bodies[sent_before:], history)
        muted = [e for e in events if e["alert"]["labels"].get("alertname") == "WorkerDown"
                 and e["to_state"] == "firing"]
        assert muted[0]["muted_by"] == f"silence #{silence.json()['id']}", muted[:2]
        borrowed.call("POST", f"/api/v1/silences/{silence.json()['id']}/expire/")
        # Killed twice (more often by earlier borrowers): the worker that keeps restarting
        # (symptom 8). Gone after it was ready, with no OOM line in its log: an engine that
        # died after it was ready.
        restarts = wait_for_symptom(borrowed, "restarts", "engine-died", ("present", "suspected"))
        assert any(e["text"].startswith("decode-0 restarted") for e in restarts["evidence"]), \
            restarts
        deliveries = borrowed.call("GET", "/api/v1/deliveries/").json()["results"]
        assert {d["state"] for d in deliveries} == {"sent"}, deliveries
    finally:
        borrowed.call("DELETE", f"/api/v1/notifiers/{notifier.json()['id']}/")


def alert_id(handle: Handle) -> int:
    alerts = handle.call("GET", "/api/v1/alerts/", params={"deployment": NAME}).json()["results"]
    [alert] = [a for a in alerts if a["labels"].get("alertname") == "WorkerDown"
               and a["labels"].get("process") == "decode-0"]
    return alert["id"]
