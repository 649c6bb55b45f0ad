"""Pages offer what the role may do and nothing else: the buttons a viewer, an operator and an
admin of the team see on the deployment, its list and the keys page."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from tests.console.world import World, build_world


@pytest.fixture
def world(db: None, tmp_path: Path) -> World:
    return build_world(tmp_path)


def page(world: World, who: str, url: str) -> str:
    client = Client()
    client.force_login(world.user(who))
    response = client.get(url)
    assert response.status_code == 200, (who, url, response.status_code)
    return response.content.decode()


@pytest.mark.parametrize(("who", "operate", "edit"), [
    ("viewer", False, False), ("operator", True, False), ("admin", True, True),
    ("root", True, True)])
def test_the_deployment_page_shows_the_roles_buttons(world: World, who: str, operate: bool,
                                                     edit: bool) -> None:
    html = page(world, who, f"/deployments/{world.deployment.name}/")
    assert ('id="start"' in html) is operate
    assert ('id="stop"' in html) is operate
    assert ('id="run-gate"' in html) is operate
    assert ('id="edit"' in html) is edit
    assert '<strong id="team">alpha</strong>' in html


@pytest.mark.parametrize(("who", "create"), [("viewer", False), ("operator", False),
                                             ("admin", True)])
def test_only_a_team_admin_is_offered_a_new_deployment(world: World, who: str,
                                                       create: bool) -> None:
    assert ('id="new-deployment"' in page(world, who, "/")) is create


@pytest.mark.parametrize(("who", "operate"), [("viewer", False), ("operator", True)])
def test_the_keys_page_offers_making_and_revoking_to_operators(world: World, who: str,
                                                               operate: bool) -> None:
    html = page(world, who, "/keys/")
    assert "alpha-key" in html
    assert ('id="key-form"' in html) is operate
    assert (f'action="/keys/{world.key.pk}/revoke/"' in html) is operate


def test_an_outsider_finds_no_deployment_page(world: World) -> None:
    client = Client()
    client.force_login(world.outsider)
    assert client.get(f"/deployments/{world.deployment.name}/").status_code == 404
    assert "alpha-dep" not in client.get("/").content.decode()
