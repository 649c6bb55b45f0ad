"""Unknown is never done: an admin answer that cannot be read (refused, an error status, a body
that is not JSON or not of the asked shape) is an ``AdminUnreadable``, never an empty answer.
The key sync records no usage and pushes no key set on it and goes on to the next router; the
pool sync keeps a removed worker running until the drain limit and adds no worker. Against a
stub admin API on a real socket; a real router that stalls is in test_pool_sync.py and
test_gateway.py."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from console.control.pools import PoolSync
from console.deployments.models import Deployment
from console.gateway.models import ApiKey
from console.gateway.router_admin import AdminUnreadable, Push, fetch_usage, push_keys
from console.gateway.services import key_set
from console.gateway.sync import KeySync
from console.supervisor.models import ManagedProcess
from tests.console.tiny_models import make_plan

pytestmark = pytest.mark.django_db

BEFORE = datetime(2024, 1, 1, tzinfo=UTC)
LATER = datetime(2024, 6, 1, tzinfo=UTC).timestamp()


class AdminStub(ThreadingHTTPServer):
    """A router's admin API that gives ``answer`` to every GET and ``push_status`` to a PUT."""

    def __init__(self, port: int, answer: tuple[int, bytes], push_status: int = 200):
        self.answer = answer
        self.push_status = push_status
        self.pushed: list[dict[str, object]] = []
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: AdminStub

    def log_message(self, *_args: object) -> None:
        return None

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._send(*self.server.answer)

    def do_PUT(self) -> None:  # noqa: N802
        self.server.pushed.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send(self.server.push_status, b'{"version": "x", "keys": 0, "open": false}')


StubFactory = Callable[..., AdminStub]


@pytest.fixture
def admin_stub() -> Iterator[StubFactory]:
    started: list[AdminStub] = []

    def start(deployment: Deployment, status: int, body: object, push_status: int = 200) -> AdminStub:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        stub = AdminStub(deployment.router_port, (status, raw), push_status)
        threading.Thread(target=stub.serve_forever, args=(0.05,), daemon=True).start()
        started.append(stub)
        return stub

    yield start
    for stub in started:
        stub.shutdown()
        stub.server_close()


def running(tmp_path: Path, name: str, router_runs: bool = True) -> Deployment:
    """A running plan with its router's process row: a live process (this one, which does not
    answer on the router's port), or one that has exited."""
    deployment = make_plan(tmp_path, name=name, desired_state=Deployment.DesiredState.RUNNING)
    state = ManagedProcess.State.READY if router_runs else ManagedProcess.State.STOPPED
    ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                  port=deployment.router_port,
                                  pid=os.getpid() if router_runs else None, state=state,
                                  log_path=str(tmp_path / f"{name}-router.log"))
    return deployment


@pytest.fixture
def key(db: None) -> ApiKey:
    return ApiKey.objects.create(name="ci", prefix="0123abcd", key_hash="0" * 64,
                                 all_deployments=True, last_used_at=BEFORE)


def usage_of(key: ApiKey, version: str | None) -> dict[str, object]:
    answer: dict[str, object] = {"keys": {str(key.pk): {"last_used": LATER, "requests": 3}}}
    if version is not None:
        answer["version"] = version
    return answer


# ---- key usage ------------------------------------------------------------------------------------

@pytest.mark.parametrize("status, body", [
    (500, b"overloaded"),
    (401, b'{"error": {"message": "missing or invalid admin token"}}'),
    (200, b"<html>a proxy's page</html>"),
    (200, b"[]"),
    (200, b'{"keys": {}}'),                    # no version
    (200, b'{"version": "v1", "keys": []}'),   # keys of another shape
])
def test_usage_that_cannot_be_read_is_unreadable_not_empty(
        tmp_path: Path, admin_stub: StubFactory, status: int, body: bytes) -> None:
    deployment = running(tmp_path, "a")
    admin_stub(deployment, status, body)
    with pytest.raises(AdminUnreadable, match=r"GET /admin/keys/usage"):
        fetch_usage(deployment)


def test_usage_of_a_router_that_refuses_connections_is_unreadable(tmp_path: Path) -> None:
    deployment = running(tmp_path, "a")  # nothing listens on its port
    with pytest.raises(AdminUnreadable, match=r"GET /admin/keys/usage: ConnectError"):
        fetch_usage(deployment)


def test_a_readable_answer_comes_back_whole(tmp_path: Path, admin_stub: StubFactory,
                                            key: ApiKey) -> None:
    deployment = running(tmp_path, "a")
    admin_stub(deployment, 200, usage_of(key, "v1"))
    assert fetch_usage(deployment) == usage_of(key, "v1")


def test_an_unreadable_usage_answer_records_nothing_and_pushes_nothing(
        tmp_path: Path, admin_stub: StubFactory, key: ApiKey,
        caplog: pytest.LogCaptureFixture) -> None:
    deployment = running(tmp_path, "a")
    # Usage without the key set's version: not the router's answer, so not "version differs".
    stub = admin_stub(deployment, 200, usage_of(key, None))
    with caplog.at_level(logging.WARNING, "pdserve.gateway"):
        assert KeySync().sync_once() == 0
    key.refresh_from_db()
    assert key.last_used_at == BEFORE  # the stored value stays
    assert stub.pushed == []
    assert "key usage of a unreadable (GET /admin/keys/usage: not a usage answer" in caplog.text
    assert "asking again next round" in caplog.text

    stub.answer = (200, json.dumps(usage_of(key, key_set(deployment)["version"])).encode())
    assert KeySync().sync_once() == 1  # the next round reads it
    key.refresh_from_db()
    assert key.last_used_at is not None and key.last_used_at.timestamp() == LATER
    assert stub.pushed == []  # its version is current


def test_one_unreadable_router_does_not_end_the_round_for_the_others(
        tmp_path: Path, admin_stub: StubFactory, key: ApiKey,
        caplog: pytest.LogCaptureFixture) -> None:
    garbled = admin_stub(running(tmp_path, "a"), 200, b"{not json")
    behind = admin_stub(running(tmp_path, "b"), 200, usage_of(key, "stale"))
    with caplog.at_level(logging.WARNING, "pdserve.gateway"):
        assert KeySync().sync_once() == 1
    assert "key usage of a unreadable (GET /admin/keys/usage: not JSON" in caplog.text
    key.refresh_from_db()
    assert key.last_used_at is not None and key.last_used_at.timestamp() == LATER
    assert garbled.pushed == []
    assert [pushed["version"] for pushed in behind.pushed] == \
        [key_set(Deployment.objects.get(name="b"))["version"]]


def test_a_key_push_says_whether_no_router_runs_or_the_one_running_did_not_take_it(
        tmp_path: Path, admin_stub: StubFactory) -> None:
    stopped = running(tmp_path, "a", router_runs=False)
    assert push_keys(stopped, key_set(stopped)) is Push.NO_ROUTER

    deployment = running(tmp_path, "b")
    assert push_keys(deployment, key_set(deployment)) is Push.FAILED  # refused connection
    stub = admin_stub(deployment, 200, {}, push_status=500)
    assert push_keys(deployment, key_set(deployment)) is Push.FAILED
    stub.push_status = 200
    assert push_keys(deployment, key_set(deployment)) is Push.SENT
    assert len(stub.pushed) == 2


# ---- pools ----------------------------------------------------------------------------------------

def test_a_removed_worker_is_kept_while_its_running_router_refuses_then_stopped_at_the_limit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    deployment = running(tmp_path, "a")  # the router's process runs; nothing answers on its port
    worker = deployment.workers.get(role="decode")
    pools = PoolSync(drain_limit_s=0.3)
    with caplog.at_level(logging.WARNING, "pdserve.supervisor"):
        assert not pools.drained(deployment, worker.role, worker.url)
        assert not pools.drained(deployment, worker.role, worker.url)
        time.sleep(0.35)  # the limit passes
        assert pools.drained(deployment, worker.role, worker.url)
    assert caplog.text.count(f"cannot read whether {worker.url} is drained") == 1
    # The seconds are whole and the refused connects take time on a loaded machine: 0 or 1.
    assert re.search(r"router admin API unreadable for [01] s \(last error: GET /admin/backends: "
                     r"ConnectError", caplog.text)
    assert f"stopping {worker.url} anyway" in caplog.text
    assert pools.draining == {}


def test_a_pool_listing_of_another_shape_is_unknown_too(tmp_path: Path,
                                                        admin_stub: StubFactory) -> None:
    deployment = running(tmp_path, "a")
    admin_stub(deployment, 200, {"roles": ["decode"]})
    worker = deployment.workers.get(role="decode")
    pools = PoolSync()
    assert not pools.drained(deployment, worker.role, worker.url)
    assert pools.draining[(deployment.pk, worker.url)].last_error.startswith(
        "GET /admin/backends: not a pool listing")


def test_without_a_router_process_there_is_nothing_to_drain(tmp_path: Path) -> None:
    deployment = running(tmp_path, "a", router_runs=False)
    worker = deployment.workers.get(role="decode")
    pools = PoolSync()
    assert pools.drained(deployment, worker.role, worker.url)
    assert pools.draining == {}


def test_the_pool_sync_adds_nothing_to_a_router_it_cannot_read_and_says_so_once(
        tmp_path: Path, admin_stub: StubFactory, caplog: pytest.LogCaptureFixture) -> None:
    deployment = running(tmp_path, "a")
    for worker in deployment.workers.all():
        ManagedProcess.objects.create(deployment=deployment, slot=worker.slot, role=worker.role,
                                      port=worker.port, state=ManagedProcess.State.READY,
                                      log_path=str(tmp_path / f"{worker.slot}.log"))
    stub = admin_stub(deployment, 503, b"busy")
    pools = PoolSync(sync_every_s=0)
    with caplog.at_level(logging.INFO, "pdserve.supervisor"):
        assert not pools.step()
        assert not pools.step()
        stub.answer = (200, json.dumps({"roles": {role: {"backends": [
            {"url": w.url, "state": "ready"}]} for role, w in
            ((w.role, w) for w in deployment.workers.all())}}).encode())
        assert not pools.step()  # every planned worker is a member: nothing to add
    assert caplog.text.count("router admin API unreadable (GET /admin/backends: 503 busy)") == 1
    assert "router admin API answers again" in caplog.text
