"""API keys in the console: REST API and page (the key shown once, only its hash stored, scope,
revocation, 400 naming the field), the key file and admin token a router starts with, and keys
pushed to a real router process and its usage read back (and not taken for "unused" while that
router does not answer)."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.control.worker_specs import process_specs
from console.deployments.models import Deployment
from console.gateway.models import ApiKey
from console.gateway.router_admin import admin_token, console_key
from console.gateway.services import key_set, keys_file_path
from console.gateway.sync import KeySync
from console.supervisor.models import ManagedProcess
from inference.router.keys import key_hash, public_prefix
from tests.console.passwords import OWNER_PASSWORD
from tests.console.sockets import listening, wait_for
from tests.console.tiny_models import make_startable
from tests.console.tokens import token_for

URL = "/api/v1/keys/"
OnCommit = Callable[..., Any]


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR)


def create(api: APIClient, **fields: Any) -> dict[str, Any]:
    response = api.post(URL, {"name": "ci", "all_deployments": True, **fields}, format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


# ---- REST API -----------------------------------------------------------------------------------

def test_a_created_key_is_shown_once_and_stored_only_as_a_hash(api: APIClient,
                                                               deployment: Deployment) -> None:
    created = create(api, requests_per_minute=60, max_concurrency=2,
                     all_deployments=False, deployments=[deployment.name])
    secret = created["key"]
    assert secret.startswith("pds_") and len(secret) > 40
    assert created["prefix"] == f"pds_{public_prefix(secret)}…"
    assert created["deployments"] == [deployment.name] and created["state"] == "active"
    assert created["created_by"] == "owner" and created["requests_per_minute"] == 60

    stored = ApiKey.objects.get()
    assert stored.key_hash == key_hash(secret)
    row = json.dumps(list(ApiKey.objects.values()), default=str)
    assert secret not in row and secret.split("_", 2)[2] not in row

    for response in (api.get(URL), api.get(f"{URL}{stored.pk}/")):
        assert response.status_code == 200
        assert secret not in response.content.decode() and "key_hash" not in response.content.decode()
    listed = api.get(URL).json()["results"][0]
    assert "key" not in listed and listed["last_used_at"] is None


def test_update_limits_and_scope_then_revoke(api: APIClient, deployment: Deployment) -> None:
    created = create(api)
    detail = f"{URL}{created['id']}/"
    response = api.patch(detail, {"all_deployments": False, "deployments": [deployment.name],
                                  "generated_tokens_per_minute": 5000}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["deployments"] == [deployment.name]
    assert response.json()["generated_tokens_per_minute"] == 5000
    response = api.patch(detail, {"generated_tokens_per_minute": None}, format="json")
    assert response.json()["generated_tokens_per_minute"] is None
    assert (response.json()["priority"], response.json()["priority_header"]) == ("normal", False)
    response = api.patch(detail, {"priority": "low", "priority_header": True}, format="json")
    assert (response.json()["priority"], response.json()["priority_header"]) == ("low", True)

    revoked = api.post(f"{detail}revoke")
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    first = revoked.json()["revoked_at"]
    assert api.post(f"{detail}revoke").json()["revoked_at"] == first
    assert api.delete(detail).status_code == 405  # revoked, never deleted


@pytest.mark.parametrize("fields, field", [
    ({"name": ""}, "name"),
    ({"all_deployments": False}, "deployments"),
    ({"all_deployments": True, "deployments": ["smollm2-1p1d"]}, "deployments"),
    ({"all_deployments": False, "deployments": ["no-such-deployment"]}, "deployments"),
    ({"requests_per_minute": 0}, "requests_per_minute"),
    ({"prompt_tokens_per_minute": -5}, "prompt_tokens_per_minute"),
    ({"generated_tokens_per_minute": "lots"}, "generated_tokens_per_minute"),
    ({"max_concurrency": 2_000_000_000}, "max_concurrency"),
    ({"priority": "urgent"}, "priority"),
    ({"priority_header": "sometimes"}, "priority_header"),
])
def test_bad_input_is_400_naming_the_field_and_saves_nothing(
        api: APIClient, deployment: Deployment, fields: dict[str, Any], field: str) -> None:
    response = api.post(URL, {"name": "ci", "all_deployments": True, **fields}, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert not ApiKey.objects.exists()


def test_the_api_needs_a_login(outsider: User, deployment: Deployment) -> None:
    client = APIClient()
    assert client.get(URL).status_code in (401, 403)
    assert client.post(URL, {"name": "x", "all_deployments": True}, format="json").status_code in (401, 403)
    # A deactivated account's leftover token opens nothing.
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(outsider)}")
    assert client.get(URL).status_code in (401, 403)
    assert not ApiKey.objects.exists()


# ---- the page -----------------------------------------------------------------------------------

def test_the_page_creates_shows_the_key_once_and_revokes(owner: User, deployment: Deployment) -> None:
    client = Client()
    assert client.login(username="owner", password=OWNER_PASSWORD)
    page = client.get("/keys/")
    assert page.status_code == 200 and b"No keys yet" in page.content
    assert b'href="/keys/"' in page.content  # the nav links here

    created = client.post("/keys/new/", {"name": "batch jobs", "deployments": [deployment.name],
                                          "prompt_tokens_per_minute": "1000"})
    assert created.status_code == 201
    assert created["Cache-Control"] == "no-store"
    key = ApiKey.objects.get()
    body = created.content.decode()
    secret = body.split('id="new-key-value">')[1].split("<")[0]
    assert key_hash(secret) == key.key_hash and key.prompt_tokens_per_minute == 1000
    assert 'id="copy-key"' in body

    listed = client.get("/keys/").content.decode()
    assert secret not in listed and f"pds_{key.prefix}…" in listed and "never" in listed

    assert client.post(f"/keys/{key.pk}/revoke/").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None

    refused = client.post("/keys/new/", {"name": "no scope"})
    assert refused.status_code == 400 and b"pick at least one deployment" in refused.content
    assert ApiKey.objects.count() == 1


# ---- what a router is told ----------------------------------------------------------------------

def test_the_key_set_names_scope_and_revocation_but_no_secret(
        api: APIClient, deployment: Deployment, django_capture_on_commit_callbacks: OnCommit,
        data_dir: Path) -> None:
    other = Deployment.objects.create(name="other", base_model=deployment.base_model,
                                      served_model_name="x", router_port=9990)
    assert key_set(deployment)["require_key"] is False  # no key yet: the router stays open
    with django_capture_on_commit_callbacks(execute=True):
        mine = create(api, all_deployments=False, deployments=[deployment.name])
        theirs = create(api, all_deployments=False, deployments=["other"])
        everywhere = create(api, all_deployments=True)
        api.post(f"{URL}{everywhere['id']}/revoke")

    states = {entry["id"]: entry["state"] for entry in key_set(deployment)["keys"]}
    assert states == {mine["id"]: "active", theirs["id"]: "out_of_scope",
                      everywhere["id"]: "revoked", "console": "active"}
    assert key_set(deployment)["require_key"] is True

    path = keys_file_path(deployment)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = path.read_text()
    assert json.loads(written) == key_set(deployment)
    for secret in (mine["key"], theirs["key"], everywhere["key"], console_key(deployment)):
        assert secret not in written
    assert keys_file_path(other).is_file()

    # Revoking the only key of a deployment keeps its router closed.
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"{URL}{theirs['id']}/revoke")
    assert key_set(other)["require_key"] is True


def test_the_router_starts_with_the_key_file_and_an_admin_token_in_its_environment(
        deployment: Deployment, data_dir: Path) -> None:
    router = next(spec for spec in process_specs(deployment) if spec.slot == "router")
    token = admin_token(deployment)
    assert router.env["PDSERVE_ROUTER_ADMIN_TOKEN"] == token and token not in " ".join(router.argv)
    flag = router.argv.index("--keys-file")
    assert router.argv[flag + 1] == str(keys_file_path(deployment))
    assert json.loads(keys_file_path(deployment).read_text())["version"] == key_set(deployment)["version"]


# ---- console -> real router -----------------------------------------------------------------------

@pytest.fixture
def running_router(deployment: Deployment, data_dir: Path) -> Iterator[tuple[Deployment, str]]:
    """The deployment's router as the supervisor starts it (its workers are not started: key
    checks and /v1/models need none), with its process row."""
    deployment = make_startable(deployment)
    spec = next(spec for spec in process_specs(deployment) if spec.slot == "router")
    log = data_dir / "router.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(spec.argv, env={**os.environ, **spec.env}, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: listening(deployment.router_port) or process.poll() is not None,
                 "the router to listen", timeout=60)
        assert process.poll() is None, log.read_text()
        ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                      port=deployment.router_port, pid=process.pid,
                                      state=ManagedProcess.State.READY, log_path=str(log))
        yield deployment, f"http://127.0.0.1:{deployment.router_port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


def models(base: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/v1/models", headers=headers, timeout=5)


def test_keys_reach_a_running_router_and_its_usage_comes_back(
        api: APIClient, running_router: tuple[Deployment, str],
        django_capture_on_commit_callbacks: OnCommit) -> None:
    deployment, base = running_router
    assert models(base, None).status_code == 200  # no key exists: open, as before keys

    with django_capture_on_commit_callbacks(execute=True):
        first = create(api, all_deployments=False, deployments=[deployment.name])
    # Pushed at once: no restart, and a key is required from now on.
    assert models(base, first["key"]).status_code == 200
    assert models(base, None).status_code == 401
    assert models(base, console_key(deployment)).status_code == 200  # the playground's key

    with django_capture_on_commit_callbacks(execute=True):
        second = create(api, all_deployments=True, requests_per_minute=100)
        api.post(f"{URL}{first['id']}/revoke")
    refused = models(base, first["key"])
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert models(base, second["key"]).status_code == 200

    # The supervisor's key sync records last use ...
    assert KeySync().sync_once() == 1
    assert ApiKey.objects.get(pk=second["id"]).last_used_at is not None

    # ... and re-pushes the set to a router that missed a change.
    stale = {**key_set(deployment), "version": "stale", "require_key": False}
    auth = {"Authorization": f"Bearer {admin_token(deployment)}"}
    assert httpx.put(f"{base}/admin/keys", json=stale, headers=auth, timeout=5).status_code == 200
    assert KeySync().sync_once() == 1
    current = httpx.get(f"{base}/admin/keys", headers=auth, timeout=5).json()
    assert current["version"] == key_set(deployment)["version"]
    assert models(base, None).status_code == 401


def test_usage_of_a_router_that_does_not_answer_is_unknown_and_read_again_later(
        api: APIClient, running_router: tuple[Deployment, str], caplog: pytest.LogCaptureFixture,
        django_capture_on_commit_callbacks: OnCommit) -> None:
    deployment, base = running_router
    with django_capture_on_commit_callbacks(execute=True):
        key = create(api, all_deployments=True)
    assert models(base, key["key"]).status_code == 200
    assert KeySync().sync_once() == 1
    used = ApiKey.objects.get(pk=key["id"]).last_used_at
    assert used is not None

    # Stopped (SIGSTOP), the router still accepts connections but answers nothing: a timeout.
    pid = deployment.processes.get(slot="router").pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, "pdserve.gateway"):
            assert KeySync().sync_once() == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (f"key usage of {deployment.name} unreadable (GET /admin/keys/usage: ReadTimeout"
            in caplog.text)
    assert ApiKey.objects.get(pk=key["id"]).last_used_at == used  # kept, not reset

    assert models(base, key["key"]).status_code == 200
    assert KeySync().sync_once() == 1  # read again once it answers
    assert ApiKey.objects.get(pk=key["id"]).last_used_at > used


def test_the_keys_api_is_in_the_openapi_schema(db: None) -> None:
    schema = APIClient().get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/keys/"])
    assert {"get", "put", "patch"} <= set(paths["/api/v1/keys/{id}/"])
    assert "post" in paths["/api/v1/keys/{id}/revoke/"]
    created = paths["/api/v1/keys/"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    component = created["$ref"].rsplit("/", 1)[1]
    assert "key" in schema.json()["components"]["schemas"][component]["properties"]
