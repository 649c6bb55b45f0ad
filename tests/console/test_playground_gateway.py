"""The gateway's playground: any model of the gateway the user may see, by its served name or an
alias (resolved to the deployment that answers it), chatting through that deployment's own
playground path with the same rights: an operator chats, a viewer reads, an outsider sees
nothing of the team."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from console.deployments.models import Deployment
from console.gateway.aliases import create_alias
from tests.console.team_users import Crew, make_crew
from tests.console.tiny_models import make_plan


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


def _as(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def test_any_visible_model_or_alias_opens_its_deployments_chat(
        crew: Crew, deployment: Deployment, tmp_path: Path) -> None:
    create_alias(name="house-chat", team=crew.team, targets=[deployment], user=None)
    theirs = make_plan(tmp_path, "their-plan", team=crew.stranger.memberships.get().team)
    operator = _as(crew.operator)

    picker = operator.get("/playground/").content.decode()
    assert f'value="{deployment.served_model_name}"' in picker
    assert 'value="house-chat"' in picker and f"alias of {deployment.name}" in picker
    assert theirs.served_model_name not in picker and theirs.name not in picker
    assert 'href="/playground/"' in operator.get("/gateway/").content.decode()

    chat_url = f'data-url="/api/v1/deployments/{deployment.pk}/chat"'
    by_name = operator.get("/playground/", {"model": deployment.served_model_name})
    page = by_name.content.decode()
    assert by_name.status_code == 200 and chat_url in page and 'id="chat-form"' in page
    assert "picked-alias" not in page
    by_alias = operator.get("/playground/", {"model": "house-chat"}).content.decode()
    assert chat_url in by_alias and 'id="picked-alias"' in by_alias
    assert '<option value="house-chat" selected>' in by_alias

    unknown = operator.get("/playground/", {"model": "nope"})
    assert unknown.status_code == 400 and "model: no model &#x27;nope&#x27;" in unknown.content.decode()
    # Another team's model is unknown to this user, not refused by name.
    assert operator.get("/playground/", {"model": theirs.served_model_name}).status_code == 400

    viewer = _as(crew.viewer).get("/playground/", {"model": "house-chat"}).content.decode()
    assert chat_url in viewer and 'id="chat-form"' not in viewer and 'id="chat-refused"' in viewer
    stranger = _as(crew.stranger)
    assert stranger.get("/playground/", {"model": "house-chat"}).status_code == 400
    assert "house-chat" not in stranger.get("/playground/").content.decode()
    assert Client().get("/playground/").status_code == 302  # to the login page
