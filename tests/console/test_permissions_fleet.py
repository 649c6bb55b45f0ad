"""Nodes are every team's: anyone signed in reads them, only a superuser adds, edits, removes
or rediscovers one, and each change writes one audit entry."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.audit.models import AuditEntry
from console.fleet.models import Node
from console.fleet.services import local_node
from tests.console.team_users import Crew, actions, api_as, make_crew

BOX = {"name": "gpu-b", "address": "10.0.0.2", "cpu_count": 16, "memory_gib": 128,
       "gpus": [{"index": 0, "name": "NVIDIA L4", "memory_gib": 24}]}


@pytest.fixture
def crew(db: None) -> Crew:
    return make_crew()


@pytest.fixture
def box(db: None, owner: User) -> Node:
    response = api_as(owner).post("/api/v1/nodes/", BOX, format="json")
    assert response.status_code == 201, response.content
    return Node.objects.get(pk=response.json()["id"])


def test_members_read_nodes_but_change_nothing(crew: Crew, box: Node) -> None:
    local = local_node()
    before = actions()
    for user in (crew.viewer, crew.admin, crew.stranger):
        api = api_as(user)
        assert api.get(f"/api/v1/nodes/{box.pk}/").status_code == 200
        refused = [api.post("/api/v1/nodes/", {**BOX, "name": "other"}, format="json"),
                   api.patch(f"/api/v1/nodes/{box.pk}/", {"cpu_count": 4}, format="json"),
                   api.delete(f"/api/v1/nodes/{box.pk}/"),
                   api.post("/api/v1/nodes/discover/")]
        assert [r.status_code for r in refused] == [403] * 4, user
    page = Client()
    page.force_login(crew.admin)
    html = page.get("/nodes/").content.decode()
    assert 'id="node-form"' not in html and 'id="discover"' not in html and "Remove" not in html
    assert page.post(f"/nodes/{box.pk}/delete/").status_code == 403
    assert page.post("/nodes/discover/").status_code == 403
    assert page.post("/nodes/new/", {"name": "other", "address": "10.0.0.3"}).status_code == 403
    assert actions() == before
    assert Node.objects.get(pk=box.pk).cpu_count == 16
    assert Node.objects.get(pk=local.pk).discovered_at == local.discovered_at
    assert api_as(None).get("/api/v1/nodes/").status_code == 401


def test_each_superuser_change_writes_one_entry(owner: User, box: Node) -> None:
    api = api_as(owner)
    assert api.patch(f"/api/v1/nodes/{box.pk}/", {"cpu_count": 8}, format="json"
                     ).status_code == 200
    assert api.post("/api/v1/nodes/discover/").status_code == 200
    assert api.delete(f"/api/v1/nodes/{box.pk}/").status_code == 204
    assert actions("node.") == [
        ("node.create", "owner"), ("node.edit", "owner"), ("node.discover", "owner"),
        ("node.delete", "owner")]
    # The diff names what changed, and the delete keeps what the node was.
    assert AuditEntry.objects.get(action="node.edit").changes == {
        "cpu_ids": [list(range(16)), list(range(8))]}
    assert AuditEntry.objects.get(action="node.delete").object_repr == "gpu-b"


def test_the_page_offers_changes_to_a_superuser(owner: User, box: Node) -> None:
    page = Client()
    page.force_login(owner)
    html = page.get("/nodes/").content.decode()
    assert 'id="node-form"' in html and 'id="discover"' in html and "Remove" in html
    assert page.post(f"/nodes/{box.pk}/delete/").status_code == 302
    assert actions()[-1] == ("node.delete", "owner")
