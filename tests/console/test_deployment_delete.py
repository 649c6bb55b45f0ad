"""DELETE /api/v1/deployments/{id}/: refused while the deployment runs or a process of it is
alive; once stopped it takes the plan, its keys file, KV directory and logs, and leaves its
audit entries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.audit.models import AuditEntry
from console.control import lifecycle
from console.control.worker_specs import kv_storage_path
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.services import create_key, keys_file_path, write_keys_file
from console.supervisor.models import ManagedProcess

pytestmark = pytest.mark.django_db


@pytest.fixture
def files(deployment: Deployment, settings: Any, tmp_path: Path) -> list[Path]:
    """The deployment's keys file, a KV file and a log, where the console keeps them."""
    settings.DATA_DIR = tmp_path / "data"
    settings.PDSERVE_KV_DIR = tmp_path / "kv"
    settings.PDSERVE_LOG_DIR = tmp_path / "data" / "logs"
    create_key(name="k", team=deployment.team, deployments=[deployment], all_deployments=False,
               limits={}, user=None)
    kv = kv_storage_path(deployment) / "abc.safetensors"
    log = Path(settings.PDSERVE_LOG_DIR) / deployment.name / "decode-0.log"
    for path in (kv, log):
        path.parent.mkdir(parents=True)
        path.write_text("x")
    return [write_keys_file(deployment), kv, log]


def test_a_running_deployment_is_not_deleted(api: APIClient, deployment: Deployment,
                                             files: list[Path]) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(desired_state="running")
    response = api.delete(f"/api/v1/deployments/{deployment.pk}/")
    assert response.status_code == 409
    assert response.json() == {"detail": f"{deployment.name} is running: stop it first"}
    assert Deployment.objects.filter(pk=deployment.pk).exists()
    assert all(path.exists() for path in files)


def test_a_stopped_deployment_with_a_process_alive_is_not_deleted(
        api: APIClient, deployment: Deployment, files: list[Path]) -> None:
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode", port=8200,
                                  pid=12345, state=ManagedProcess.State.STOPPING)
    response = api.delete(f"/api/v1/deployments/{deployment.pk}/")
    assert response.status_code == 409
    assert "decode-0 still alive" in response.json()["detail"]
    assert Deployment.objects.filter(pk=deployment.pk).exists()
    assert all(path.exists() for path in files)


def test_a_stopped_deployment_is_deleted_with_its_files_and_keeps_its_audit_entries(
        api: APIClient, deployment: Deployment, files: list[Path],
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    lifecycle.stop(deployment)
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode", port=8200,
                                  state=ManagedProcess.State.STOPPED)
    workers = WorkerPlan.objects.filter(deployment=deployment).count()
    assert workers > 0
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/v1/deployments/{deployment.pk}/")
    assert response.status_code == 204, response.content
    assert not Deployment.objects.filter(pk=deployment.pk).exists()
    assert not WorkerPlan.objects.filter(deployment_id=deployment.pk).exists()
    assert not ManagedProcess.objects.filter(deployment_id=deployment.pk).exists()
    assert [path for path in files if path.exists()] == []
    assert not kv_storage_path(deployment).exists() and not keys_file_path(deployment).exists()
    entries = AuditEntry.objects.filter(object_type="deployments.deployment",
                                        object_id=str(deployment.pk))
    assert {"deployment.stop", "deployment.delete"} <= set(entries.values_list("action", flat=True))
    assert api.get(f"/api/v1/deployments/{deployment.pk}/").status_code == 404
