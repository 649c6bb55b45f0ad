"""Every child of the supervisor gets an allow-listed environment: none of the console's
secrets, whatever its kind; a vLLM server gets its own key, which is stored nowhere."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from console.control.daemon import Supervisor
from console.control.worker_specs import ProcessSpec, process_specs
from console.deployments.models import Deployment
from console.gateway.router_admin import admin_token
from console.quantization.builder import _env as builder_env
from console.supervisor import process_requests
from console.supervisor.engine import environment
from console.supervisor.models import ManagedProcess
from console.supervisor.worker_keys import deployment_worker_key, requested_server_key
from inference.output_gate import ReferenceServer, server_command
from tests.unit.test_worker_auth import NEEDED, SECRETS

Kind = ManagedProcess.Kind


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The supervisor's environment holds every secret the console has."""
    for name, value in {**SECRETS, **NEEDED}.items():
        if name != "PATH":
            monkeypatch.setenv(name, value)
    settings.REDIS_URL = None


def leaked(env: dict[str, str]) -> list[str]:
    """The variables of ``env`` holding one of the supervisor's secrets (a child's own key or
    token, set by its spec, has another value)."""
    values = set(SECRETS.values())
    return sorted(name for name, value in env.items() if value in values)


def test_no_kind_of_child_gets_the_consoles_secrets(poisoned: None, deployment: Deployment) -> None:
    specs = {spec.slot: spec for spec in process_specs(deployment)}
    server_env = server_command(ReferenceServer(model_path="/m", port=0), 8300)[1]
    children = {
        **{slot: (ManagedProcess(kind=Kind.ROUTER if slot == "router" else Kind.WORKER,
                                 deployment=deployment, slot=slot), spec.env)
           for slot, spec in specs.items()},
        "gate": (ManagedProcess(kind=Kind.GATE_REFERENCE, slot="gate-1-reference"), server_env),
        "measurement": (ManagedProcess(kind=Kind.MEASUREMENT, slot="measure-1-variant"), server_env),
        "builder": (ManagedProcess(kind=Kind.BUILDER, slot="build-1"), builder_env()),
    }
    assert {"prefill-0", "decode-0", "router"} <= set(children)
    for name, (record, spec_env) in children.items():
        env = environment(record, spec_env)
        assert leaked(env) == [], name
        assert env["HF_HOME"] == "/hf" and env["OMP_NUM_THREADS"] == "1", name
        assert "REDIS_URL" not in env, name
    key = deployment_worker_key(deployment.name)
    for slot in ("prefill-0", "decode-0"):
        assert environment(*children[slot])["VLLM_API_KEY"] == key
    router = environment(*children["router"])
    assert router["PDSERVE_WORKER_KEY"] == key and "VLLM_API_KEY" not in router
    assert router["PDSERVE_ROUTER_ADMIN_TOKEN"] == admin_token(deployment)
    assert environment(*children["gate"])["VLLM_API_KEY"] == requested_server_key("gate-1-reference")
    assert "VLLM_API_KEY" not in environment(*children["builder"])


def test_the_router_gets_the_consoles_redis_by_name_and_workers_do_not(
        poisoned: None, deployment: Deployment, settings: Any) -> None:
    settings.REDIS_URL = "redis://:console-redis@127.0.0.1:6379/0"
    specs = {spec.slot: spec for spec in process_specs(deployment)}
    assert specs["router"].env["REDIS_URL"] == settings.REDIS_URL
    assert "REDIS_URL" not in environment(
        ManagedProcess(kind=Kind.WORKER, deployment=deployment, slot="prefill-0"),
        specs["prefill-0"].env)


@pytest.fixture
def supervisor(db: None, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=1.0)


def environ_of(pid: int) -> dict[str, str]:
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(psutil.Error):
            env = psutil.Process(pid).environ()
            if "VLLM_API_KEY" in env or time.monotonic() > deadline:
                return env
        time.sleep(0.05)


SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_spawned_worker_reads_no_secret_in_its_environment_and_its_key_is_stored_nowhere(
        poisoned: None, supervisor: Supervisor, deployment: Deployment) -> None:
    spec = ProcessSpec(slot="prefill-0", role="prefill", port=1, argv=SLEEP, env={"MARK": "1"})
    supervisor._spawn(deployment, spec)
    row = ManagedProcess.objects.get(deployment=deployment, slot="prefill-0")
    env = environ_of(row.pid)
    key = deployment_worker_key(deployment.name)
    assert env["VLLM_API_KEY"] == key and env["MARK"] == "1"
    assert leaked(env) == []
    assert key not in str(row.command) and key not in str(row.env)
    assert key not in Path(row.log_path).read_text()


def test_a_requested_server_gets_its_own_key_and_its_row_keeps_none(
        poisoned: None, supervisor: Supervisor, tmp_path: Path) -> None:
    row = process_requests.request(Kind.GATE_REFERENCE, "gate-9-reference", SLEEP, {"MARK": "2"},
                                   tmp_path / "gate.log", port=1)
    supervisor.start_requested()
    row.refresh_from_db()
    env = environ_of(row.pid)
    key = requested_server_key("gate-9-reference")
    assert env["VLLM_API_KEY"] == key and env["MARK"] == "2"
    assert leaked(env) == []
    assert row.env == {"MARK": "2"} and key not in str(row.command)
