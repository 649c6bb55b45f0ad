"""The gateway as the supervisor runs it: started with the configuration of the moment in its
file and its admin token in its environment, kept current by the sync (routers, keys,
aliases), and started again after a kill with what it was last told. A real gateway process in
front of a real router process (no workers: key checks, /v1/models and the routing need none).
"""

from __future__ import annotations

import json
import os
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from console.control.daemon import Supervisor
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.aliases import create_alias
from console.gateway.routes_config import gateway_config
from console.gateway.services import create_key
from console.gateway.sync import KeySync
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port, wait_for

# Fixtures: the data directory in settings (autouse), a real router process as its deployment's.
from tests.console.test_gateway import data_dir, running_router  # noqa: F401

OnCommit = Callable[..., Any]


@pytest.fixture
def gateway_port(settings: Any) -> int:
    settings.PDSERVE_GATEWAY_PORT = free_port()
    return int(settings.PDSERVE_GATEWAY_PORT)


@pytest.fixture
def supervisor(db: None, gateway_port: int, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=2.0)


def gateway_row() -> ManagedProcess | None:
    return ManagedProcess.objects.filter(kind=ManagedProcess.Kind.GATEWAY).first()


def tick_until_ready(sup: Supervisor, why: str) -> ManagedProcess:
    def ready() -> bool:
        sup.tick()
        row = gateway_row()
        return row is not None and row.state == ManagedProcess.State.READY
    wait_for(ready, why, timeout=60, interval=0.25)
    row = gateway_row()
    assert row is not None
    return row


def models(port: int, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=5)


def ids(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {entry["id"] for entry in response.json()["data"]}


def test_the_supervisor_runs_the_gateway_the_sync_keeps_it_current_and_a_kill_loses_nothing(
        supervisor: Supervisor, running_router: tuple[Deployment, str],  # noqa: F811
        gateway_port: int, owner: User, django_capture_on_commit_callbacks: OnCommit) -> None:
    # The deployment is not wanted running (no workers start), but its router runs and is
    # recorded ready: what the gateway needs to route to it.
    deployment, router = running_router
    row = tick_until_ready(supervisor, "the gateway to start")
    token = gateway_process.admin_token()
    assert row.role == "gateway" and row.deployment is None and row.port == gateway_port
    assert token not in " ".join(row.command)
    path = gateway_process.config_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["version"] == gateway_config()["version"]

    # Open (no key made for it): anyone lists it; a request goes to its router, which answers
    # for itself (no workers: 503), and the gateway says which deployment answered.
    assert deployment.served_model_name in ids(models(gateway_port))
    answer = httpx.post(f"http://127.0.0.1:{gateway_port}/v1/completions", timeout=30, json={
        "model": deployment.served_model_name, "prompt": "hi", "max_tokens": 1})
    assert answer.headers["X-Pdserve-Deployment"] == deployment.name, answer.text
    assert answer.status_code == httpx.post(f"{router}/v1/completions", timeout=30, json={
        "model": deployment.served_model_name, "prompt": "hi", "max_tokens": 1}).status_code

    # A key for it and an alias: pushed once committed, no sync round needed.
    with django_capture_on_commit_callbacks(execute=True):
        _key, secret = create_key(name="k", team=deployment.team, deployments=[deployment],
                                  all_deployments=False, limits={}, user=owner)
        create_alias(name="chat", team=deployment.team, targets=[deployment], user=owner)
    assert models(gateway_port).status_code == 200
    assert ids(models(gateway_port)) == set()  # needs a key now
    assert ids(models(gateway_port, secret)) == {deployment.served_model_name, "chat"}
    bad = models(gateway_port, secret[:-2] + "xx")
    assert bad.status_code == 401, bad.text

    # A gateway that missed a change (here: told an old configuration by hand) is put right by
    # the sync's next round.
    stale = {**gateway_config(), "aliases": [], "version": "stale"}
    assert httpx.put(f"http://127.0.0.1:{gateway_port}/admin/config", json=stale, timeout=5,
                     headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert ids(models(gateway_port, secret)) == {deployment.served_model_name}
    KeySync().sync_gateway()
    assert ids(models(gateway_port, secret)) == {deployment.served_model_name, "chat"}

    # Killed: started again, with the alias and the key from its file.
    os.kill(row.pid, signal.SIGKILL)

    def started_again() -> bool:
        supervisor.tick()
        current = gateway_row()
        return current is not None and current.pid not in (None, row.pid)
    wait_for(started_again, "the gateway to be started again", timeout=60, interval=0.25)
    restarted = tick_until_ready(supervisor, "the restarted gateway")
    assert restarted.restarts == row.restarts + 1
    assert ids(models(gateway_port, secret)) == {deployment.served_model_name, "chat"}


def test_with_the_gateway_off_nothing_starts(tmp_path: Path, deployment: Deployment) -> None:
    # Off: tests/console/conftest.py's setting, as PDSERVE_GATEWAY_PORT=0 sets it.
    sup = Supervisor(log_dir=tmp_path / "logs")
    try:
        sup.tick()
        assert gateway_row() is None and not gateway_process.config_path().exists()
    finally:
        sup.stop_all(grace_s=1.0)
