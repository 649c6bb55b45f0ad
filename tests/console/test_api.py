"""The REST API: token login, listing and reading deployments, and start/stop requests."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.deployments.models import Deployment, WorkerPlan
from console.supervisor.models import ManagedProcess
from tests.console.passwords import OUTSIDER_PASSWORD, OWNER_PASSWORD
from tests.console.tiny_models import make_startable
from tests.console.tokens import token_for

TOKEN_URL = "/api/v1/auth/token/"
LIST_URL = "/api/v1/deployments/"

State = ManagedProcess.State


def detail_url(deployment: Deployment) -> str:
    return f"{LIST_URL}{deployment.pk}/"


def token_client(username: str, password: str) -> APIClient:
    """A client authenticated the way scripts do it: obtain a token, then send it."""
    client = APIClient()
    response = client.post(TOKEN_URL, {"username": username, "password": password}, format="json")
    assert response.status_code == 201, response.content
    client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    return client


@pytest.fixture
def api(owner: User) -> APIClient:
    return token_client(owner.username, OWNER_PASSWORD)


def add_process(deployment: Deployment, slot: str, role: str, port: int, state: str,
                pid: int | None = None) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=port,
                                         state=state, pid=pid, log_path="/nonexistent.log")


def add_full_process_table(deployment: Deployment, states: dict[str, str]) -> None:
    ports = {"prefill-0": 8100, "decode-0": 8200, "decode-1": 8201, "colocated-0": 8300,
             "router": deployment.router_port}
    for slot, state in states.items():
        add_process(deployment, slot, slot.split("-")[0], ports[slot], state)


def set_desired(deployment: Deployment, desired: str) -> None:
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=desired)


def clone_deployment(template: Deployment, name: str, router_port: int) -> Deployment:
    """Another deployment with workers and processes, so every relation has rows to fetch."""
    clone = Deployment.objects.create(name=name, base_model=template.base_model,
                                      served_model_name=name, router_port=router_port,
                                      desired_state=Deployment.DesiredState.RUNNING)
    for worker in template.workers.all():
        WorkerPlan.objects.create(deployment=clone, role=worker.role, variant=worker.variant,
                                  port=worker.port + router_port, cpu_cores=worker.cpu_cores)
        add_process(clone, worker.slot, worker.role, worker.port + router_port, State.READY)
    add_process(clone, "router", "router", router_port, State.READY)
    return clone


# ---- authentication -------------------------------------------------------------------------


def test_token_login_returns_a_token_that_opens_the_api(owner: User, deployment: Deployment) -> None:
    response = APIClient().post(TOKEN_URL, {"username": "owner", "password": OWNER_PASSWORD},
                                format="json")
    assert response.status_code == 201
    token = response.json()["token"]
    assert isinstance(token, str) and len(token) >= 20

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get(LIST_URL).status_code == 200


def test_token_login_with_a_wrong_password_is_refused(owner: User) -> None:
    response = APIClient().post(TOKEN_URL, {"username": "owner", "password": "not-the-password"},
                                format="json")
    assert response.status_code == 400
    assert "token" not in response.json()


def test_a_deactivated_account_cannot_obtain_a_token(outsider: User) -> None:
    response = APIClient().post(TOKEN_URL, {"username": "outsider", "password": OUTSIDER_PASSWORD},
                                format="json")
    assert response.status_code == 400
    assert "token" not in response.json()


def _outsider_clients(outsider: User) -> dict[str, APIClient]:
    anonymous = APIClient()
    bogus = APIClient()
    bogus.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    stale_token = APIClient()
    stale_token.credentials(HTTP_AUTHORIZATION=f"Token {token_for(outsider)}")
    stale_session = APIClient()
    stale_session.force_login(outsider)
    return {"anonymous": anonymous, "bogus token": bogus, "deactivated account's token": stale_token,
            "deactivated account's session": stale_session}


def test_the_outsider_must_see_nothing(outsider: User, deployment: Deployment) -> None:
    for who, client in _outsider_clients(outsider).items():
        for url in (LIST_URL, detail_url(deployment)):
            response = client.get(url)
            assert response.status_code in (401, 403), (who, url, response.status_code)
            assert deployment.name.encode() not in response.content, (who, url)


def test_the_outsider_cannot_start_or_stop(outsider: User, deployment: Deployment) -> None:
    set_desired(deployment, Deployment.DesiredState.STOPPED)
    for who, client in _outsider_clients(outsider).items():
        response = client.post(f"{detail_url(deployment)}start/")
        assert response.status_code in (401, 403), (who, response.status_code)
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.STOPPED


# ---- reading --------------------------------------------------------------------------------


def test_list_shows_the_default_deployment(api: APIClient, deployment: Deployment) -> None:
    body = api.get(LIST_URL).json()
    assert body["count"] == 1
    [item] = body["results"]
    assert item["id"] == deployment.pk
    assert item["name"] == "smollm2-1p1d"
    assert item["kv_channel"] == "shared-storage"
    assert item["router_url"] == f"http://127.0.0.1:{deployment.router_port}"
    assert {(w["slot"], w["port"], w["cpu_cores"]) for w in item["workers"]} == {
        ("prefill-0", 8100, "0"), ("decode-0", 8200, "1")
    }
    assert item["processes"] == []
    assert item["state"] == "stopped"


def test_detail_retrieves_one_deployment(api: APIClient, deployment: Deployment) -> None:
    response = api.get(detail_url(deployment))
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == deployment.name
    assert body["served_model_name"] == "smollm2"
    assert {w["model_path"] for w in body["workers"]} == {deployment.workers.first().variant.path}


def test_detail_of_a_missing_deployment_is_404(api: APIClient, deployment: Deployment) -> None:
    assert api.get(f"{LIST_URL}{deployment.pk + 1000}/").status_code == 404


@pytest.mark.parametrize(
    ("desired", "states", "expected"),
    [
        ("running", {"prefill-0": State.READY, "decode-0": State.READY, "router": State.READY},
         "ready"),
        ("running", {"prefill-0": State.READY, "decode-0": State.FAILED, "router": State.READY},
         "failed"),
        # Ready only counts when every planned slot reports in, not just those that exist.
        ("running", {"prefill-0": State.READY, "router": State.READY}, "starting"),
        ("running", {"prefill-0": State.STARTING, "decode-0": State.READY, "router": State.READY},
         "starting"),
        # A slot the plan no longer has (scaled down, or a switch of topology) leaves its row:
        # stopped or still draining, it holds up nothing; failed, it fails nothing.
        ("running", {"prefill-0": State.READY, "decode-0": State.READY, "router": State.READY,
                     "decode-1": State.STOPPED, "colocated-0": State.FAILED}, "ready"),
        ("running", {"prefill-0": State.READY, "decode-0": State.READY, "router": State.READY,
                     "decode-1": State.STOPPING}, "ready"),
        ("stopped", {"prefill-0": State.STOPPED, "decode-0": State.FAILED, "router": State.STOPPED},
         "stopped"),
        ("stopped", {"prefill-0": State.STOPPED, "decode-0": State.STOPPING,
                     "router": State.STOPPED}, "stopping"),
    ],
)
def test_detail_state_is_derived_from_the_processes(
    api: APIClient, deployment: Deployment, desired: str, states: dict[str, str], expected: str
) -> None:
    set_desired(deployment, desired)
    add_full_process_table(deployment, states)
    body = api.get(detail_url(deployment)).json()
    assert body["state"] == expected
    assert {p["slot"]: p["state"] for p in body["processes"]} == states


def test_list_query_count_does_not_grow_with_deployments(api: APIClient,
                                                         deployment: Deployment) -> None:
    set_desired(deployment, Deployment.DesiredState.RUNNING)
    add_full_process_table(deployment, {"prefill-0": State.READY, "decode-0": State.READY,
                                        "router": State.READY})

    def count_queries() -> tuple[int, dict[str, Any]]:
        with CaptureQueriesContext(connection) as queries:
            response = api.get(LIST_URL)
        assert response.status_code == 200
        return len(queries), response.json()

    # The token's first call also writes its last use (once a minute): not a query per row.
    count_queries()
    one, body = count_queries()
    assert body["count"] == 1
    for n in range(4):
        clone_deployment(deployment, f"clone-{n}", router_port=9000 + n)
    five, body = count_queries()
    assert body["count"] == 5
    # Every clone is fully ready, so its state proves its workers and processes were read.
    assert {item["state"] for item in body["results"]} == {"ready"}
    assert five == one


# ---- start / stop ---------------------------------------------------------------------------


def test_start_records_the_wish_and_answers_202(api: APIClient, deployment: Deployment) -> None:
    make_startable(deployment)  # start runs the pre-flight checks (tests/console/test_checks*.py)
    set_desired(deployment, Deployment.DesiredState.STOPPED)
    response = api.post(f"{detail_url(deployment)}start/")
    assert response.status_code == 202
    assert response.json()["desired_state"] == "running"
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.RUNNING


def test_stop_records_the_wish_and_answers_202(api: APIClient, deployment: Deployment) -> None:
    set_desired(deployment, Deployment.DesiredState.RUNNING)
    response = api.post(f"{detail_url(deployment)}stop/")
    assert response.status_code == 202
    assert response.json()["desired_state"] == "stopped"
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.STOPPED


def test_deployments_cannot_be_renamed(api: APIClient, deployment: Deployment) -> None:
    # Plans are edited over the API (tests/console/test_plans*.py), deleted once stopped
    # (tests/console/test_deployment_delete.py); the name keys their logs.
    response = api.patch(detail_url(deployment), {"name": "renamed"}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()
    assert Deployment.objects.filter(name="smollm2-1p1d").exists()
