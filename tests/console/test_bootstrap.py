"""`manage.py bootstrap` and the process plan it leads to."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from console.catalog.models import BaseModel, Variant
from console.control.worker_specs import kv_storage_path, process_specs
from console.deployments.models import Deployment, WorkerPlan

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "smollm2-135m-instruct"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_ADMIN_USER", "operator")
    monkeypatch.setenv("PDSERVE_ADMIN_PASSWORD", "correct horse battery")
    monkeypatch.delenv("PDSERVE_ADMIN_PASSWORD_FILE", raising=False)


def bootstrap(**options: Any) -> str:
    out = io.StringIO()
    call_command("bootstrap", stdout=out, **options)
    return out.getvalue()


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count()
            for model in (User, BaseModel, Variant, Deployment, WorkerPlan)}


@pytest.mark.usefixtures("admin_env")
def test_bootstrap_creates_the_admin_and_the_default_plan(model_dir: Path) -> None:
    output = bootstrap(model_dir=model_dir)
    assert "created admin user 'operator'" in output
    assert "correct horse battery" not in output
    assert "created deployment smollm2-1p1d" in output

    admin = User.objects.get(username="operator")
    assert admin.is_superuser and admin.is_staff
    assert admin.check_password("correct horse battery")

    deployment = Deployment.objects.get(name="smollm2-1p1d")
    assert deployment.mode == Deployment.Mode.PD
    assert deployment.kv_channel == "shared-storage"
    assert deployment.router_port == 8080
    assert deployment.desired_state == Deployment.DesiredState.STOPPED
    workers = {w.role: w for w in deployment.workers.select_related("variant")}
    assert set(workers) == {"prefill", "decode"}
    assert (workers["prefill"].cpu_cores, workers["prefill"].port) == ("0", 8100)
    assert (workers["decode"].cpu_cores, workers["decode"].port) == ("1", 8200)
    assert {w.variant.path for w in workers.values()} == {str(model_dir.resolve())}


@pytest.mark.usefixtures("admin_env")
def test_bootstrap_is_idempotent(model_dir: Path) -> None:
    bootstrap(model_dir=model_dir)
    before = counts()
    assert before == {"User": 1, "BaseModel": 1, "Variant": 1, "Deployment": 1, "WorkerPlan": 2}

    output = bootstrap(model_dir=model_dir)
    assert "kept deployment smollm2-1p1d" in output
    assert "created" not in output
    assert counts() == before


@pytest.mark.usefixtures("admin_env")
def test_bootstrap_keeps_the_operators_changes(model_dir: Path) -> None:
    bootstrap(model_dir=model_dir)
    Deployment.objects.filter(name="smollm2-1p1d").update(
        desired_state=Deployment.DesiredState.RUNNING, max_model_len=4096
    )
    bootstrap(model_dir=model_dir)
    deployment = Deployment.objects.get(name="smollm2-1p1d")
    assert (deployment.desired_state, deployment.max_model_len) == ("running", 4096)


def test_bootstrap_without_a_password_generates_and_prints_one_once(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PDSERVE_ADMIN_USER", raising=False)
    monkeypatch.delenv("PDSERVE_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("PDSERVE_ADMIN_PASSWORD_FILE", raising=False)

    output = bootstrap(model_dir=model_dir)
    match = re.search(r"created admin user 'admin' with password: (\S+)", output)
    assert match, output
    password = match.group(1)
    assert len(password) >= 12
    assert User.objects.get(username="admin").check_password(password)

    again = bootstrap(model_dir=model_dir)
    assert "password" not in again
    assert password not in again
    assert User.objects.get(username="admin").check_password(password)


def test_bootstrap_reads_the_password_from_a_file(model_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "admin-password"
    secret.write_text("from-a-mounted-secret\n")
    monkeypatch.delenv("PDSERVE_ADMIN_USER", raising=False)
    monkeypatch.delenv("PDSERVE_ADMIN_PASSWORD", raising=False)
    monkeypatch.setenv("PDSERVE_ADMIN_PASSWORD_FILE", str(secret))
    output = bootstrap(model_dir=model_dir)
    assert "from-a-mounted-secret" not in output
    assert User.objects.get(username="admin").check_password("from-a-mounted-secret")


@pytest.mark.usefixtures("admin_env")
def test_bootstrap_resets_a_changed_admin_password(model_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap(model_dir=model_dir)
    monkeypatch.setenv("PDSERVE_ADMIN_PASSWORD", "a new password")
    output = bootstrap(model_dir=model_dir)
    assert "updated the password of 'operator'" in output
    admin = User.objects.get(username="operator")
    assert admin.check_password("a new password")
    assert not admin.check_password("correct horse battery")


@pytest.mark.usefixtures("admin_env")
def test_bootstrap_rejects_a_model_dir_without_config(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(CommandError, match="--model-dir") as excinfo:
        bootstrap(model_dir=empty)
    assert str(empty) in str(excinfo.value)
    assert not Deployment.objects.exists()


# ---- the plan's process specs ---------------------------------------------------------------


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


@pytest.mark.usefixtures("admin_env")
def test_process_specs_of_the_default_plan(model_dir: Path, settings: Any, tmp_path: Path) -> None:
    settings.PDSERVE_KV_DIR = tmp_path / "kv"
    settings.PDSERVE_API_KEY = ""
    bootstrap(model_dir=model_dir)
    deployment = Deployment.objects.get(name="smollm2-1p1d")

    specs = {spec.slot: spec for spec in process_specs(deployment)}
    assert set(specs) == {"prefill-0", "decode-0", "router"}

    storage = str(kv_storage_path(deployment))
    assert storage == str(tmp_path / "kv" / "smollm2-1p1d")
    for slot, kv_role in (("prefill-0", "kv_producer"), ("decode-0", "kv_consumer")):
        spec = specs[slot]
        assert spec.argv[0] == sys.executable
        assert flag_value(spec.argv, "--model") == str(model_dir.resolve())
        assert flag_value(spec.argv, "--port") == str(spec.port)
        config = json.loads(flag_value(spec.argv, "--kv-transfer-config"))
        assert config["kv_connector"] == "PdserveSharedStorageConnector"
        assert config["kv_role"] == kv_role
        # Both sides must read and write the same directory.
        assert config["kv_connector_extra_config"]["shared_storage_path"] == storage
    assert (specs["prefill-0"].port, specs["decode-0"].port) == (8100, 8200)
    assert specs["prefill-0"].env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert specs["decode-0"].env["VLLM_CPU_OMP_THREADS_BIND"] == "1"

    router = specs["router"]
    assert router.port == 8080
    assert router.argv[:3] == [sys.executable, "-m", "inference.router"]
    assert flag_values(router.argv, "--prefill") == ["http://127.0.0.1:8100"]
    assert flag_values(router.argv, "--decode") == ["http://127.0.0.1:8200"]
    assert flag_values(router.argv, "--colocated") == []
    assert flag_value(router.argv, "--port") == "8080"
    assert flag_value(router.argv, "--kv-channel") == "shared-storage"
    assert "PDSERVE_API_KEY" not in router.env


@pytest.mark.usefixtures("admin_env")
def test_the_router_gets_the_api_key_when_one_is_set(model_dir: Path, settings: Any) -> None:
    settings.PDSERVE_API_KEY = "sk-test"
    bootstrap(model_dir=model_dir)
    specs = {spec.slot: spec for spec in process_specs(Deployment.objects.get())}
    assert specs["router"].env["PDSERVE_API_KEY"] == "sk-test"
