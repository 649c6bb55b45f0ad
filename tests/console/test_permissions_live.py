"""Logs, metrics, dashboards, request timelines and their websockets are the deployment's
team's: a member of another team gets 404 (a websocket closes with 4404), as for a deployment
that does not exist; the process table lists only the processes of visible deployments; a
process of no deployment (a builder, a measurement, a gate's reference) is a superuser's."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.asgi import application
from console.deployments.models import Deployment
from console.live.models import ProcessScrape
from console.supervisor.models import ManagedProcess
from tests.console.team_users import Crew, api_as, make_crew
from tests.console.tokens import token_for

ORIGIN = (b"origin", b"http://127.0.0.1")
Kind = ManagedProcess.Kind


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def decode(deployment: Deployment) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                         port=8200, state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


@pytest.fixture
def builder(db: None) -> ManagedProcess:
    return ManagedProcess.objects.create(kind=Kind.BUILDER, slot="build-3", port=0,
                                         state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


def urls(deployment: Deployment, process: ManagedProcess) -> list[str]:
    return [f"/api/v1/processes/{process.pk}/", f"/api/v1/processes/{process.pk}/logs",
            f"/api/v1/processes/{process.pk}/logs/download", f"/processes/{process.pk}/log/",
            f"/api/v1/deployments/{deployment.pk}/metrics",
            f"/deployments/{deployment.name}/dashboard/",
            f"/deployments/{deployment.name}/requests/?id=abc"]


def test_the_team_reads_its_deployments_live_views_and_others_get_404(
        crew: Crew, deployment: Deployment, decode: ManagedProcess) -> None:
    for user, code in ((crew.viewer, 200), (crew.operator, 200), (crew.stranger, 404)):
        client = Client()
        client.force_login(user)
        assert [client.get(url).status_code for url in urls(deployment, decode)] == [code] * 7, user
    anonymous = Client()
    assert anonymous.get(f"/api/v1/processes/{decode.pk}/logs").status_code == 401
    assert anonymous.get(f"/deployments/{deployment.name}/dashboard/").status_code == 302


def test_the_process_table_lists_what_its_reader_may_see(
        crew: Crew, owner: User, decode: ManagedProcess, builder: ManagedProcess) -> None:
    def listed(user: User) -> set[int]:
        response = api_as(user).get("/api/v1/processes/")
        assert response.status_code == 200
        return {row["id"] for row in response.json()["results"]}

    assert listed(owner) == {decode.pk, builder.pk}
    assert listed(crew.viewer) == {decode.pk}
    assert listed(crew.stranger) == set()
    assert api_as(crew.stranger).get(f"/api/v1/processes/{decode.pk}/").status_code == 404


def test_a_process_of_no_deployment_is_a_superusers(crew: Crew, owner: User,
                                                    builder: ManagedProcess) -> None:
    paths = [f"/api/v1/processes/{builder.pk}/", f"/api/v1/processes/{builder.pk}/logs",
             f"/api/v1/processes/{builder.pk}/logs/download", f"/processes/{builder.pk}/log/"]
    for user, code in ((crew.admin, 404), (owner, 200)):
        client = Client()
        client.force_login(user)
        assert [client.get(path).status_code for path in paths] == [code] * 4, user


async def _connect(path: str, user: User) -> tuple[bool, int | None]:
    client = Client()
    await sync_to_async(client.force_login)(user)
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, cookie])
    outcome = await communicator.connect(timeout=5)
    if outcome[0]:
        await communicator.disconnect()
    return outcome


@pytest.mark.django_db(transaction=True)
async def test_websockets_close_for_outsiders(deployment: Deployment, decode: ManagedProcess,
                                              builder: ManagedProcess) -> None:
    crew = await sync_to_async(make_crew)()
    live = f"/ws/deployments/{deployment.pk}/live/"
    logs = f"/ws/processes/{decode.pk}/logs/"
    assert await _connect(live, crew.viewer) == (True, None)
    assert await _connect(logs, crew.viewer) == (True, None)
    assert await _connect(live, crew.stranger) == (False, 4404)
    assert await _connect(logs, crew.stranger) == (False, 4404)
    assert await _connect(f"/ws/processes/{builder.pk}/logs/", crew.admin) == (False, 4404)


def test_the_prometheus_export_shows_a_reader_their_teams_deployments(
        crew: Crew, owner: User, deployment: Deployment, decode: ManagedProcess,
        builder: ManagedProcess) -> None:
    now = timezone.now()
    for process in (decode, builder):
        ProcessScrape.objects.create(process=process, scraped=now,
                                     text=f"# TYPE up gauge\nup{{slot=\"{process.slot}\"}} 1.0\n")

    def scraped(headers: dict[str, str]) -> tuple[int, str]:
        response = Client(headers=headers).get("/metrics")
        return response.status_code, response.content.decode()

    def bearer(user: User) -> dict[str, str]:
        return {"Authorization": f"Bearer {token_for(user, 'prometheus')}"}

    code, body = scraped(bearer(crew.viewer))
    assert code == 200 and 'process="decode-0"' in body
    # A process of no deployment has no dashboard, and no export either.
    assert "build-3" not in body
    code, body = scraped(bearer(owner))
    assert code == 200 and 'process="decode-0"' in body and "build-3" not in body
    code, body = scraped(bearer(crew.stranger))
    assert code == 200 and deployment.name not in body
    assert scraped({"Authorization": "Bearer pds_not-a-token"})[0] == 401
    assert Client().get("/metrics").status_code == 302
    page = Client()
    page.force_login(crew.viewer)
    assert 'process="decode-0"' in page.get("/metrics").content.decode()
    assert page.post("/metrics").status_code == 405
