"""Model aliases at the gateway (console/gateway/aliases.py) and the configuration the gateway
is told (console/gateway/routes_config.py): REST API and page, 400 naming the field with
nothing saved, team scope, and each deployment's router address, state and key scope."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.accounts.models import Team
from console.deployments.models import Deployment
from console.gateway.models import ApiKey, ModelAlias
from console.gateway.routes_config import gateway_config
from console.gateway.services import create_key
from console.supervisor.models import ManagedProcess
from inference.gateway.config import parse_config
from tests.console.passwords import OWNER_PASSWORD

URL = "/api/v1/aliases/"


@pytest.fixture
def second(deployment: Deployment) -> Deployment:
    """A second deployment of the same team, serving another name."""
    other = Deployment.objects.get(pk=deployment.pk)
    other.pk = None
    other.name, other.served_model_name, other.router_port = "backup", "backup-model", 8181
    other.save()
    return other


def test_an_alias_names_deployments_in_order_and_changes(api: APIClient, deployment: Deployment,
                                                        second: Deployment) -> None:
    response = api.post(URL, {"name": "chat", "targets": [second.name, deployment.name]},
                        format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["targets"] == ["backup", deployment.name] and created["team"] == "default"
    assert created["created_by"] == "owner"

    detail = f"{URL}{created['id']}/"
    changed = api.patch(detail, {"targets": [deployment.name]}, format="json")
    assert changed.status_code == 200 and changed.json()["targets"] == [deployment.name]
    renamed = api.patch(detail, {"name": "chat-v2"}, format="json")
    assert renamed.json()["name"] == "chat-v2" and renamed.json()["targets"] == [deployment.name]
    assert api.delete(detail).status_code == 204
    assert not ModelAlias.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "", "targets": ["$d"]}, "name"),
    ({"name": "bad name", "targets": ["$d"]}, "name"),
    ({"name": "$served", "targets": ["$d"]}, "name"),
    ({"name": "chat"}, "targets"),
    ({"name": "chat", "targets": []}, "targets"),
    ({"name": "chat", "targets": ["no-such-deployment"]}, "targets"),
    ({"name": "chat", "targets": ["$d", "$d"]}, "targets"),
    ({"name": "chat", "targets": ["$foreign"]}, "targets"),
])
def test_bad_input_is_400_naming_the_field_and_saves_nothing(
        api: APIClient, deployment: Deployment, body: dict[str, Any], field: str) -> None:
    foreign = Deployment.objects.get(pk=deployment.pk)
    foreign.pk, foreign.name, foreign.served_model_name = None, "theirs", "theirs-model"
    foreign.team = Team.objects.create(name="others")
    foreign.router_port = 8182
    foreign.save()
    names = {"$d": deployment.name, "$served": deployment.served_model_name,
             "$foreign": foreign.name}

    def filled(value: Any) -> Any:
        return [names.get(v, v) for v in value] if isinstance(value, list) else names.get(value, value)

    response = api.post(URL, {"team": "default", **{key: filled(value) for key, value in body.items()}},
                        format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not ModelAlias.objects.exists()


def test_an_alias_name_is_taken_once(api: APIClient, deployment: Deployment) -> None:
    assert api.post(URL, {"name": "chat", "targets": [deployment.name]},
                    format="json").status_code == 201
    again = api.post(URL, {"name": "chat", "targets": [deployment.name]}, format="json")
    assert again.status_code == 400 and "name" in again.json()
    assert ModelAlias.objects.count() == 1


def test_the_page_lists_models_and_makes_and_deletes_an_alias(owner: User,
                                                              deployment: Deployment) -> None:
    client = Client()
    assert client.login(username="owner", password=OWNER_PASSWORD)
    page = client.get("/gateway/").content.decode()
    assert f'data-model="{deployment.served_model_name}"' in page
    assert "gateway-off" in page  # tests/console/conftest.py turns it off

    bad = client.post("/gateway/aliases/new/", {"name": "chat", "targets": "nope",
                                                "team": str(deployment.team_id)})
    assert bad.status_code == 400 and "no such deployment: nope" in bad.content.decode()
    made = client.post("/gateway/aliases/new/", {"name": "chat", "targets": deployment.name,
                                                 "team": str(deployment.team_id)})
    assert made.status_code == 302
    alias = ModelAlias.objects.get()
    assert alias.target_names() == [deployment.name]
    assert 'data-alias="chat"' in client.get("/gateway/").content.decode()
    assert client.post(f"/gateway/aliases/{alias.pk}/delete/").status_code == 302
    assert not ModelAlias.objects.exists()


def test_the_gateway_is_told_routers_states_aliases_and_each_key_s_deployments(
        owner: User, deployment: Deployment, second: Deployment) -> None:
    config = gateway_config()
    by_name = {entry["name"]: entry for entry in config["deployments"]}
    # No router ready: nowhere to send a request; no key made: open, as its own router is.
    assert by_name[deployment.name]["router"] is None
    assert by_name[deployment.name]["state"] == "stopped"
    assert by_name[deployment.name]["require_key"] is False

    Deployment.objects.filter(pk=second.pk).update(desired_state="running")
    ManagedProcess.objects.create(deployment=second, slot="router", role="router",
                                  kind=ManagedProcess.Kind.ROUTER, port=second.router_port,
                                  state=ManagedProcess.State.READY, degraded="decode",
                                  log_path="/dev/null")
    key, secret = create_key(name="k", team=second.team, deployments=[second],
                             all_deployments=False, limits={}, user=owner)
    ModelAlias.objects.create(name="chat", team=second.team).targets.create(
        deployment=second, position=0)
    changed = gateway_config()
    assert changed["version"] != config["version"]
    by_name = {entry["name"]: entry for entry in changed["deployments"]}
    assert by_name["backup"] == {"name": "backup", "served_model_name": "backup-model",
                                 "router": "http://127.0.0.1:8181",
                                 "state": "degraded (no decode)", "team": "default",
                                 "require_key": True, "max_concurrency": second.concurrency}
    assert by_name[deployment.name]["require_key"] is False
    assert changed["aliases"] == [{"name": "chat", "targets": ["backup"]}]
    assert changed["keys"] == [{"id": key.pk, "prefix": key.prefix, "hash": key.key_hash,
                                "state": "active", "deployments": ["backup"], "team": "default",
                                "priority": "normal", "priority_header": False}]
    assert changed["queue"] == {"max_queue": 64, "timeout_s": 60}
    assert secret not in str(changed)
    assert gateway_config()["version"] == changed["version"]  # the same database, the same one

    # The gateway's queue opens past the plan's concurrency times the ready workers that
    # generate; a key's priority reaches it.
    for index in range(2):
        ManagedProcess.objects.create(deployment=second, slot=f"decode-{index}", role="decode",
                                      port=9300 + index, state=ManagedProcess.State.READY,
                                      log_path="/dev/null")
    ApiKey.objects.filter(pk=key.pk).update(priority="low", priority_header=True)
    grown = gateway_config()
    by_name = {entry["name"]: entry for entry in grown["deployments"]}
    assert by_name["backup"]["max_concurrency"] == 2 * second.concurrency
    assert (grown["keys"][0]["priority"], grown["keys"][0]["priority_header"]) == ("low", True)
    parse_config(grown)  # what the gateway takes
