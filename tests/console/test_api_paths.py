"""Every API path is written once and answers with and without its trailing slash (clients
write both): console/api_router.py decides that for every app's api/urls.py."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import resolve

from console.api_router import ID, api_path

pytestmark = pytest.mark.django_db


@pytest.fixture
def paths(owner: User) -> list[str]:
    client = Client()
    client.force_login(owner)
    found = list(client.get("/api/schema/", {"format": "json"}).json()["paths"])
    # Guards against an empty schema passing vacuously: paths of routers and of api_path().
    assert {"/api/v1/deployments/{id}/start/", "/api/v1/deployments/{id}/gate/",
            "/api/v1/processes/{id}/logs/", "/api/v1/auth/token/"} <= set(found)
    return found


def test_each_api_path_is_written_once(paths: list[str]) -> None:
    bare = [path.rstrip("/") for path in paths]
    assert sorted({path for path in bare if bare.count(path) > 1}) == []


def test_every_api_path_answers_with_and_without_its_trailing_slash(paths: list[str]) -> None:
    for path in paths:
        sample = re.sub(r"\{[^}]+\}", "1", path).rstrip("/")
        without, with_slash = resolve(sample), resolve(sample + "/")
        assert (without.func, without.url_name) == (with_slash.func, with_slash.url_name), path


def test_an_api_path_is_written_without_its_end() -> None:
    assert api_path(rf"deployments/{ID}/gate", lambda request: None,
                    name="x").pattern.regex.pattern == r"^deployments/(?P<pk>[0-9]+)/gate/?$"
    for route in ("^deployments", "deployments/", "deployments$"):
        with pytest.raises(ValueError, match="without anchors or trailing slash"):
            api_path(route, lambda request: None, name="x")


@pytest.mark.parametrize("path", ["/api/v1/deployments/", "/api/v1/deployments"])
def test_the_api_root_and_lists_answer_both_ways(owner: User, path: str) -> None:
    client = Client()
    client.force_login(owner)
    assert client.get(path).status_code == 200
