"""An open websocket follows its reader's access: a member removed from the deployment's team,
or a deactivated user, has their log, metrics and alert sockets closed (4403) at once; a
change the socket was not told of (made in another process without Redis) is noticed before a
send once the last check is RECHECK_EVERY_S old; the other members' sockets stay open."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from console.accounts import services
from console.accounts.models import Membership, Role
from console.asgi import application
from console.deployments.models import Deployment
from console.live import access, consumers
from console.live.consumers import CLOSE_ACCESS_ENDED
from console.live.groups import deployment_group, emit
from console.supervisor.models import ManagedProcess
from tests.console.team_users import Crew, make_crew

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture
def decode(deployment: Deployment) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                         port=8200, state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


def _cookie(user: User) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def _open(path: str, user: User) -> WebsocketCommunicator:
    cookie = await sync_to_async(_cookie)(user)
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, cookie])
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    return communicator


async def _closed_with(communicator: WebsocketCommunicator, timeout: float = 5) -> int:
    """The close code the socket sends within ``timeout`` (messages before it are skipped)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        message = await communicator.receive_output(timeout=max(remaining, 0.01))
        if message["type"] == "websocket.close":
            return int(message["code"])


def _membership(user: User) -> Membership:
    return Membership.objects.select_related("team", "user").get(user=user)


async def _sockets(deployment: Deployment, process: ManagedProcess,
                   user: User) -> list[WebsocketCommunicator]:
    return [await _open(f"/ws/deployments/{deployment.pk}/live/", user),
            await _open(f"/ws/processes/{process.pk}/logs/", user)]


async def test_a_removed_members_sockets_close_at_once(deployment: Deployment,
                                                       decode: ManagedProcess) -> None:
    crew: Crew = await sync_to_async(make_crew)()
    removed = await _sockets(deployment, decode, crew.viewer)
    kept = await _sockets(deployment, decode, crew.operator)
    await sync_to_async(services.remove_member)(await sync_to_async(_membership)(crew.viewer))
    for communicator in removed:
        assert await _closed_with(communicator) == CLOSE_ACCESS_ENDED
    # The members still in the team go on receiving.
    await emit(deployment_group(deployment.pk), {"type": "metrics", "data": {}})
    assert (await kept[0].receive_json_from(timeout=5))["type"] == "metrics"
    for communicator in kept:
        assert await communicator.receive_nothing(timeout=0.2)
        await communicator.disconnect()


async def test_a_role_change_keeps_the_socket_and_a_deactivation_closes_it(
        deployment: Deployment, decode: ManagedProcess, owner: User) -> None:
    crew: Crew = await sync_to_async(make_crew)()
    sockets = await _sockets(deployment, decode, crew.operator)
    await sync_to_async(services.change_role)(await sync_to_async(_membership)(crew.operator),
                                              Role.VIEWER)
    for communicator in sockets:
        assert await communicator.receive_nothing(timeout=0.3)
    await sync_to_async(services.edit_user)(crew.operator, {"is_active": False}, by=owner)
    for communicator in sockets:
        assert await _closed_with(communicator) == CLOSE_ACCESS_ENDED


async def test_a_change_the_socket_was_not_told_of_is_noticed_before_a_send(
        deployment: Deployment, decode: ManagedProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    crew: Crew = await sync_to_async(make_crew)()
    # As if the membership were removed in another process, on the in-memory channel layer.
    monkeypatch.setattr(access, "access_changed", lambda user_id: None)
    monkeypatch.setattr(consumers, "RECHECK_EVERY_S", 0.0)
    [live, logs] = await _sockets(deployment, decode, crew.viewer)
    await sync_to_async(Membership.objects.filter(user=crew.viewer).delete)()
    assert await live.receive_nothing(timeout=0.2)
    await emit(deployment_group(deployment.pk), {"type": "metrics", "data": {"secret": 1}})
    assert await _closed_with(live) == CLOSE_ACCESS_ENDED
    await logs.disconnect()


async def test_the_alert_socket_follows_the_readers_teams(deployment: Deployment,
                                                          owner: User) -> None:
    from console.alerts.streams import team_group

    crew: Crew = await sync_to_async(make_crew)()
    alerts = await _open("/ws/alerts/", crew.viewer)
    event: dict[str, Any] = {"type": "alert", "deployment": deployment.pk}
    await emit(team_group(crew.team.pk), event)
    assert await alerts.receive_json_from(timeout=5) == event
    await sync_to_async(services.remove_member)(await sync_to_async(_membership)(crew.viewer))
    # Still open (the reader may belong to other teams), but the team's alerts stop.
    await asyncio.sleep(0.2)
    await emit(team_group(crew.team.pk), event)
    assert await alerts.receive_nothing(timeout=0.3)
    # Added to a team, the reader hears of it without reconnecting.
    await sync_to_async(services.add_member)(crew.team, crew.viewer, Role.VIEWER)
    await asyncio.sleep(0.2)
    await emit(team_group(crew.team.pk), event)
    assert await alerts.receive_json_from(timeout=5) == event
    await sync_to_async(services.edit_user)(crew.viewer, {"is_active": False}, by=owner)
    assert await _closed_with(alerts) == CLOSE_ACCESS_ENDED
