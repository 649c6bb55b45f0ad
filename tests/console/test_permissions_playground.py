"""The playground chats through a deployment's router: its team's operators may (a chat spends
the team's capacity), a viewer gets 403 and a page without the chat, anyone else 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from console.deployments.models import Deployment
from tests.console.team_users import Crew, make_crew


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


def chat(client: Client, deployment: Deployment, body: str = "{}") -> Any:
    # An empty body is a 400 once past the permission check: no router is asked.
    return client.post(f"/api/v1/deployments/{deployment.pk}/chat", data=body,
                       content_type="application/json")


def test_operators_chat_viewers_are_refused_strangers_see_nothing(
        crew: Crew, deployment: Deployment) -> None:
    outcomes = {}
    for user in (crew.viewer, crew.operator, crew.admin, crew.stranger):
        client = Client()
        client.force_login(user)
        page = client.get(f"/deployments/{deployment.name}/playground/")
        outcomes[user.username] = (chat(client, deployment).status_code, page.status_code,
                                   b'id="chat-form"' in page.content)
    assert outcomes == {"vera": (403, 200, False), "otto": (400, 200, True),
                        "ada": (400, 200, True), "stan": (404, 404, False)}
    assert chat(Client(), deployment).status_code == 401
