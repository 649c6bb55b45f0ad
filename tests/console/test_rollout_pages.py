"""The revision and rollout pages: what each role sees and may press, and the rollout page's
live updates over the deployment's socket when a transition is stored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from console.accounts.models import Membership, Role, Team
from console.asgi import application
from console.deployments.models import Deployment
from console.rollouts import revisions, services
from console.rollouts.models import Revision, Rollout
from tests.console.tiny_models import make_plan, make_startable

ORIGIN = (b"origin", b"http://127.0.0.1")


def _user(team: Team, name: str, role: Role | None) -> User:
    user = User.objects.create_user(name, "", "pw")
    if role is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return user


def _world(tmp_path: Path) -> dict[str, Any]:
    team = Team.objects.create(name="pages-team")
    plan = make_startable(make_plan(tmp_path, name="paged", team=team))
    Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.RUNNING)
    plan.refresh_from_db()
    draft, _ = revisions.create_draft(plan, {"block_size": 32}, {}, None, "bigger blocks")
    return {"team": team, "plan": plan, "draft": draft,
            "viewer": _user(team, "pviewer", Role.VIEWER),
            "operator": _user(team, "poperator", Role.OPERATOR),
            "stranger": _user(Team.objects.create(name="elsewhere"), "pstranger", Role.ADMIN)}


@pytest.fixture
def world(db: None, tmp_path: Path) -> dict[str, Any]:
    return _world(tmp_path)


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_revision_page_by_role(world: dict[str, Any]) -> None:
    plan, draft = world["plan"], world["draft"]
    url = f"/deployments/{plan.name}/revisions/"
    seen = _client(world["viewer"]).get(url)
    assert seen.status_code == 200
    text = seen.content.decode()
    assert f"revision-{draft.number}" in text and "block_size" in text
    assert "Roll back to the previous revision" not in text and "make-draft" not in text
    operator = _client(world["operator"]).get(url).content.decode()
    assert "Roll back to the previous revision" in operator and "make-draft" in operator
    assert f"Roll out r{draft.number}" in operator
    assert _client(world["stranger"]).get(url).status_code == 404
    assert _client(world["viewer"]).post(f"/deployments/{plan.name}/revisions/new/",
                                         {"block_size": "64"}).status_code == 403


def test_drafting_and_rolling_out_from_the_page(world: dict[str, Any]) -> None:
    plan, draft = world["plan"], world["draft"]
    client = _client(world["operator"])
    bad = client.post(f"/deployments/{plan.name}/revisions/new/", {"block_size": "7"})
    assert bad.status_code == 400 and "error-block_size" in bad.content.decode()
    made = client.post(f"/deployments/{plan.name}/revisions/new/", {"block_size": "64"})
    assert made.status_code == 302
    assert Revision.objects.filter(deployment=plan, spec__block_size=64).exists()
    revisions_page = client.get(f"/deployments/{plan.name}/revisions/").content.decode()
    assert 'name="verify_green"' in revisions_page
    started = client.post(f"/deployments/{plan.name}/revisions/{draft.number}/rollout/",
                          {"strategy": "canary", "verify_green": "on"})
    rollout = Rollout.objects.get(deployment=plan)
    assert started.status_code == 302 and started["Location"] == f"/rollouts/{rollout.pk}/"
    assert rollout.verify_green
    page = client.get(f"/rollouts/{rollout.pk}/").content.decode()
    assert 'id="rollout-verification"' in page and "before blue is drained" in page
    detail = client.get(f"/deployments/{plan.name}/").content.decode()
    assert "rollout-in-progress" in detail and f"/rollouts/{rollout.pk}/" in detail
    refused = client.post(f"/deployments/{plan.name}/revisions/{draft.number}/rollout/",
                          {"strategy": "canary"})
    assert refused.status_code == 409 and "one rollout at a time" in refused.content.decode()


def test_the_rollout_page_shows_the_role_and_states_buttons(world: dict[str, Any]) -> None:
    rollout = services.start(world["plan"], world["draft"], "canary", world["operator"])
    url = f"/rollouts/{rollout.pk}/"
    viewer = _client(world["viewer"]).get(url).content.decode()
    assert 'id="rollout-state">starting' in viewer and "rollout-data" in viewer
    assert 'id="pause"' not in viewer
    page = _client(world["operator"]).get(url).content.decode()
    assert 'id="pause"' in page and 'id="rollback"' in page
    assert "uPlot.iife.min.js" in page and "pdserve/rollout.js" in page
    assert _client(world["stranger"]).get(url).status_code == 404
    assert _client(world["viewer"]).post(url + "pause/").status_code == 403
    client = _client(world["operator"])
    assert client.post(url + "pause/").status_code == 302
    assert client.post(url + "pause/").status_code == 409
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    assert client.post(url + "rollback/").status_code == 302


def _session(user: User) -> tuple[bytes, bytes]:
    client = _client(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def _receive_rollout(communicator: WebsocketCommunicator, timeout: float = 10.0
                           ) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        message = await communicator.receive_json_from(timeout=max(remaining, 0.01))
        if message["type"] == "rollout":
            return message


@pytest.mark.django_db(transaction=True)
async def test_a_stored_transition_reaches_the_rollout_page(tmp_path: Path) -> None:
    world = await sync_to_async(_world)(tmp_path)
    rollout = await sync_to_async(services.start)(world["plan"], world["draft"], "canary",
                                                  world["operator"])
    cookie = await sync_to_async(_session)(world["viewer"])
    communicator = WebsocketCommunicator(
        application, f"/ws/deployments/{world['plan'].pk}/live/", headers=[ORIGIN, cookie])
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    try:
        # The hub starts from "now" once it has read the newest ids: move until one is carried.
        message = None
        for _ in range(20):
            await sync_to_async(services.pause)(rollout)
            await sync_to_async(services.resume)(rollout)
            try:
                message = await _receive_rollout(communicator, timeout=1.0)
                break
            except TimeoutError:
                continue
        assert message is not None
        assert message["rollout"]["id"] == rollout.pk
        assert message["transitions"][0]["to_state"] in ("paused", "starting")
        assert message["rollout"]["weights"] == rollout.weights
    finally:
        await communicator.disconnect()
