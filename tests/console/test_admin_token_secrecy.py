"""The router's admin token goes to the router in its environment, and nowhere the console
shows: not the router's argv, not its row in the process table, not an answer of the API,
the pages, the log views or the Django admin."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.test import Client

from console.control.daemon import Supervisor
from console.control.worker_specs import process_specs
from console.deployments.models import Deployment
from console.gateway.router_admin import admin_token
from console.supervisor.admin import MASK
from console.supervisor.models import ManagedProcess

pytestmark = pytest.mark.django_db

SLEEPER = "import time; print('router stand-in', flush=True); time.sleep(300)"


@pytest.fixture
def supervisor(settings: Any, tmp_path: Path) -> Iterator[Supervisor]:
    settings.DATA_DIR = tmp_path / "data"
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=1.0)


@pytest.fixture
def browser(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def pages(deployment: Deployment, process: ManagedProcess) -> list[str]:
    return [
        "/api/v1/processes/", f"/api/v1/processes/{process.pk}/",
        f"/api/v1/processes/{process.pk}/logs", f"/api/v1/processes/{process.pk}/logs/download",
        "/api/v1/deployments/", f"/api/v1/deployments/{deployment.pk}/",
        f"/deployments/{deployment.name}/", f"/deployments/{deployment.name}/processes/",
        f"/processes/{process.pk}/log/",
        "/admin/supervisor/managedprocess/", f"/admin/supervisor/managedprocess/{process.pk}/change/",
    ]


def test_the_running_router_s_token_is_in_no_answer_of_the_console(
        supervisor: Supervisor, deployment: Deployment, browser: Client) -> None:
    token = admin_token(deployment)
    spec = next(spec for spec in process_specs(deployment) if spec.slot == "router")
    assert spec.env["PDSERVE_ROUTER_ADMIN_TOKEN"] == token
    assert not any(token in arg for arg in spec.argv)
    # The router's own spec and environment, with a stand-in for its program.
    supervisor._spawn(deployment, replace(spec, argv=[sys.executable, "-c", SLEEPER]))
    process = ManagedProcess.objects.get(deployment=deployment, slot="router")
    assert process.pid is not None
    assert token not in str(process.env) and token not in str(process.command)
    assert token in Path(f"/proc/{process.pid}/environ").read_text(errors="replace")

    for path in pages(deployment, process):
        response = browser.get(path)
        assert response.status_code == 200, (path, response.status_code)
        body = (b"".join(response.streaming_content) if response.streaming
                else response.content).decode()
        assert token not in body, f"{path} shows the admin token"


def test_a_row_written_with_the_token_shows_it_masked_and_a_migration_forgets_it(
        deployment: Deployment, browser: Client) -> None:
    # What the supervisor stored before it stopped copying planned processes' environments.
    token = admin_token(deployment)
    process = ManagedProcess.objects.create(
        deployment=deployment, slot="router", role="router", kind=ManagedProcess.Kind.ROUTER,
        port=8080, log_path="/r.log",
        env={"PDSERVE_ROUTER_ADMIN_TOKEN": token, "HF_HUB_OFFLINE": "1"})
    page = browser.get(f"/admin/supervisor/managedprocess/{process.pk}/change/").content.decode()
    assert token not in page
    assert MASK in page and "HF_HUB_OFFLINE" in page

    migration = importlib.import_module(
        "console.supervisor.migrations.0003_forget_planned_environments")
    requested = ManagedProcess.objects.create(
        slot="gate-1-reference", role="reference", kind=ManagedProcess.Kind.GATE_REFERENCE,
        port=8400, log_path="/g.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    migration.forget_planned_environments(apps, None)
    process.refresh_from_db()
    requested.refresh_from_db()
    assert process.env == {}
    assert requested.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}  # needed to start it
