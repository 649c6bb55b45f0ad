"""The process table over the API: /api/v1/processes/, read only, paginated, by deployment."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.deployments.models import Deployment
from console.supervisor.models import ManagedProcess

pytestmark = pytest.mark.django_db
URL = "/api/v1/processes/"


@pytest.fixture
def rows(deployment: Deployment) -> list[ManagedProcess]:
    other = Deployment.objects.create(name="other", base_model=deployment.base_model,
                                      served_model_name="other", max_model_len=2048)
    return [
        ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                      port=8200, pid=4242, state="ready", log_path="/x.log"),
        ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                      kind=ManagedProcess.Kind.ROUTER, port=8080, log_path="/r.log"),
        ManagedProcess.objects.create(deployment=other, slot="decode-0", role="decode", port=8300,
                                      log_path="/o.log"),
        ManagedProcess.objects.create(slot="gate-7-reference", role="reference", port=8400,
                                      kind=ManagedProcess.Kind.GATE_REFERENCE, log_path="/g.log"),
    ]


def test_the_process_table_is_listed_a_page_at_a_time(api: APIClient,
                                                      rows: list[ManagedProcess]) -> None:
    body = api.get(URL, {"limit": 2}).json()
    assert body["count"] == 4 and len(body["results"]) == 2 and body["next"]
    everything = api.get(URL).json()["results"]
    assert {(r["deployment"], r["slot"], r["kind"]) for r in everything} == {
        (rows[0].deployment_id, "decode-0", "worker"), (rows[0].deployment_id, "router", "router"),
        (rows[2].deployment_id, "decode-0", "worker"), (None, "gate-7-reference", "gate-reference")}


def test_the_processes_of_one_deployment(api: APIClient, deployment: Deployment,
                                         rows: list[ManagedProcess]) -> None:
    found = api.get(URL, {"deployment": deployment.pk}).json()["results"]
    assert [(r["slot"], r["state"], r["pid"]) for r in found] == [("decode-0", "ready", 4242),
                                                                   ("router", "stopped", None)]
    # Without its trailing slash too, like every API path.
    assert api.get(URL.rstrip("/"), {"deployment": 999999}).json()["results"] == []
    bad = api.get(URL, {"deployment": "smollm2"})
    assert bad.status_code == 400 and "deployment" in bad.json()


def test_one_process_is_read_and_nothing_is_written(api: APIClient,
                                                    rows: list[ManagedProcess]) -> None:
    body = api.get(f"{URL}{rows[0].pk}/").json()
    assert (body["id"], body["slot"], body["port"], body["wanted"]) == (rows[0].pk, "decode-0",
                                                                        8200, "running")
    assert "command" not in body and "env" not in body
    assert api.get(f"{URL}999999/").status_code == 404
    assert api.post(URL, {"slot": "x"}, format="json").status_code == 405
    assert api.patch(f"{URL}{rows[0].pk}/", {"state": "failed"}, format="json").status_code == 405
    assert api.delete(f"{URL}{rows[0].pk}/").status_code == 405
    assert ManagedProcess.objects.filter(state="failed").count() == 0


def test_the_outsider_sees_no_process(outsider: User, rows: list[ManagedProcess]) -> None:
    stale_session = APIClient()
    stale_session.force_login(outsider)
    for client in (APIClient(), stale_session):
        for url in (URL, f"{URL}{rows[0].pk}/"):
            response = client.get(url)
            assert response.status_code in (401, 403)
            assert b"decode-0" not in response.content
