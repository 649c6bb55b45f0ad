"""The rollout API: revisions listed with their changes and drafted with checks, rollouts started
and moved, each refusal a 400 naming the field or a 409 saying why, by role; and
``manage.py rollout``."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from console.accounts.models import Role, Team
from console.audit.models import AuditEntry
from console.deployments.models import Deployment
from console.rollouts import revisions
from console.rollouts.models import Revision, Rollout
from tests.console.team_users import token_client
from tests.console.tiny_models import make_plan, make_startable


@pytest.fixture
def team(db: None) -> Team:
    return Team.objects.create(name="blue-team")


@pytest.fixture
def plan(team: Team, tmp_path: Path) -> Deployment:
    deployment = make_startable(make_plan(tmp_path, team=team))
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    deployment.refresh_from_db()
    return deployment


@pytest.fixture
def operator(team: Team) -> Client:
    return token_client(team, Role.OPERATOR, "op")


@pytest.fixture
def viewer(team: Team) -> Client:
    return token_client(team, Role.VIEWER, "vi")


@pytest.fixture
def stranger(db: None) -> Client:
    other = Team.objects.create(name="other")
    return token_client(other, Role.ADMIN, "stranger")


@pytest.fixture
def draft(plan: Deployment) -> Revision:
    revision, _ = revisions.create_draft(plan, {"block_size": 32}, {}, None, "bigger blocks")
    return revision


def post(client: Client, url: str, body: dict[str, Any] | None = None) -> Any:
    return client.post(url, data=body or {}, content_type="application/json")


def test_revisions_are_listed_with_their_changes(operator: Client, plan: Deployment,
                                                 draft: Revision) -> None:
    rows = operator.get(f"/api/v1/deployments/{plan.pk}/revisions/").json()
    assert [r["number"] for r in rows] == [draft.number, draft.number - 1]
    assert rows[0]["changes"]["block_size"][1] == 32
    assert rows[0]["note"] == "bigger blocks" and rows[0]["state"] == "draft"
    assert rows[1]["changes"] is None and rows[1]["state"] == "live"


def test_a_draft_is_made_with_its_checks(operator: Client, plan: Deployment) -> None:
    before = AuditEntry.objects.count()
    response = post(operator, f"/api/v1/deployments/{plan.pk}/revisions/", {
        "block_size": 32, "gate": {"prompts": 3}, "note": "n",
        "variants": {"decode": plan.workers.get(role="decode").variant.pk}})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "draft" and body["checks"]["ok"] is True
    assert body["changes"]["gate_prompts"][1] == 3
    assert body["spec"]["block_size"] == 32
    actions = list(AuditEntry.objects.order_by("pk")[before:].values_list("action", flat=True))
    # A deployment with no live revision yet gets it made first (revisions.ensure_live): two.
    assert actions == ["revision.create", "revision.create"]


@pytest.mark.parametrize(("body", "field"), [
    ({"variants": {"decode": "nope/none"}}, "variants"),
    ({"block_size": 7}, "block_size"),
    ({}, "non_field_errors"),
    ({"variants": {"colocated": None}}, "variants"),
])
def test_a_bad_draft_is_a_400_naming_the_field(operator: Client, plan: Deployment,
                                               body: dict[str, Any], field: str) -> None:
    response = post(operator, f"/api/v1/deployments/{plan.pk}/revisions/", body)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_a_rollout_starts_is_read_and_moves(operator: Client, plan: Deployment,
                                            draft: Revision) -> None:
    response = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.name, "revision": draft.number, "strategy": "canary",
        "steps": [{"weight": 20, "hold_s": 5}, {"weight": 100}], "verify_green": True})
    assert response.status_code == 201, response.content
    rollout = response.json()
    assert rollout["verify_green"] is True and rollout["verification"] is None
    assert rollout["to_revision"] == draft.number and rollout["state"] == "starting"
    assert rollout["transitions"][0]["to_state"] == "starting"
    assert rollout["steps"][0]["weight"] == 20 and rollout["analyses"] == []
    url = f"/api/v1/rollouts/{rollout['id']}/"
    assert operator.get(url).json()["id"] == rollout["id"]
    listed = operator.get(f"/api/v1/rollouts/?deployment={plan.pk}&state=starting").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [r["id"] for r in rows] == [rollout["id"]]
    none = operator.get(f"/api/v1/rollouts/?deployment={plan.name}&state=succeeded").json()
    assert (none["results"] if isinstance(none, dict) else none) == []
    paused = post(operator, url + "pause/")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    again = post(operator, url + "pause/")
    assert again.status_code == 409 and "paused already" in again.json()["detail"]
    resumed = post(operator, url + "resume/")
    assert resumed.json()["state"] == "starting"
    promoted = post(operator, url + "promote/")
    assert promoted.status_code == 409, promoted.content
    back = post(operator, url + "rollback/")
    assert back.status_code == 200 and back.json()["state"] == "rolling_back"
    assert [t["to_state"] for t in back.json()["transitions"]] == [
        "starting", "paused", "starting", "rolling_back"]


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"strategy": "in_place"}, 400, "strategy"),
    ({"strategy": "sideways"}, 400, "strategy"),
    ({"strategy": "in_place", "verify_green": True}, 400, "verify_green"),
    ({"verify_green": "sometimes"}, 400, "verify_green"),
    ({"revision": 99}, 400, "revision"),
    ({"deployment": "nowhere"}, 400, "deployment"),
    ({"steps": [{"weight": 50}]}, 400, "steps"),
    ({"analysis": {"interval_s": 0}}, 400, "analysis.interval_s"),
])
def test_a_bad_start_names_the_field(operator: Client, plan: Deployment, draft: Revision,
                                     body: dict[str, Any], status: int, field: str) -> None:
    request = {"deployment": plan.pk, "revision": draft.number, "strategy": "canary", **body}
    response = post(operator, "/api/v1/rollouts/", request)
    assert response.status_code == status, response.content
    assert field in response.json(), response.json()


def test_a_second_rollout_and_the_live_revision_are_refused(operator: Client, plan: Deployment,
                                                            draft: Revision) -> None:
    live = revisions.live(plan)
    assert live is not None
    response = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.pk, "revision": live.number, "strategy": "blue_green"})
    assert response.status_code == 400 and "revision" in response.json()
    first = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.pk, "revision": draft.number, "strategy": "blue_green"})
    assert first.status_code == 201
    second = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.pk, "revision": draft.number, "strategy": "blue_green"})
    assert second.status_code == 409
    assert "one rollout at a time" in second.json()["non_field_errors"][0]


def test_a_stopped_deployment_refuses_with_409(operator: Client, plan: Deployment,
                                               draft: Revision) -> None:
    Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.STOPPED)
    response = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.pk, "revision": draft.number, "strategy": "canary"})
    assert response.status_code == 409 and "not running" in response.json()["non_field_errors"][0]


def test_rollback_to_previous(operator: Client, plan: Deployment, draft: Revision) -> None:
    refused = post(operator, f"/api/v1/deployments/{plan.pk}/rollback/")
    assert refused.status_code == 409, refused.content
    live = revisions.live(plan)
    assert live is not None
    Revision.objects.filter(pk=live.pk).update(state=Revision.State.RETIRED)
    Revision.objects.create(deployment=plan, number=draft.number + 1, spec=live.spec,
                            state=Revision.State.LIVE)
    response = post(operator, f"/api/v1/deployments/{plan.pk}/rollback/")
    assert response.status_code == 201, response.content
    assert response.json()["to_revision"] == live.number
    assert response.json()["strategy"] == "blue_green"


def test_roles(viewer: Client, stranger: Client, operator: Client, plan: Deployment,
               draft: Revision) -> None:
    assert viewer.get(f"/api/v1/deployments/{plan.pk}/revisions/").status_code == 200
    assert post(viewer, f"/api/v1/deployments/{plan.pk}/revisions/",
                {"block_size": 64}).status_code == 403
    assert post(viewer, "/api/v1/rollouts/", {"deployment": plan.pk, "revision": draft.number,
                                              "strategy": "canary"}).status_code == 403
    assert stranger.get(f"/api/v1/deployments/{plan.pk}/revisions/").status_code == 404
    rollout = post(operator, "/api/v1/rollouts/", {
        "deployment": plan.pk, "revision": draft.number, "strategy": "canary"}).json()
    assert viewer.get(f"/api/v1/rollouts/{rollout['id']}/").status_code == 200
    assert post(viewer, f"/api/v1/rollouts/{rollout['id']}/pause/").status_code == 403
    assert stranger.get(f"/api/v1/rollouts/{rollout['id']}/").status_code == 404
    assert post(stranger, f"/api/v1/rollouts/{rollout['id']}/pause/").status_code == 404
    listed = stranger.get("/api/v1/rollouts/").json()
    assert plan.name not in str(listed)


def test_a_bad_state_filter_is_a_400(viewer: Client, plan: Deployment) -> None:
    response = viewer.get("/api/v1/rollouts/?state=sideways")
    assert response.status_code == 400 and "state" in response.json()


def test_the_command(plan: Deployment, draft: Revision) -> None:
    out = StringIO()
    before = AuditEntry.objects.count()
    call_command("rollout", "start", plan.name, "--revision", str(draft.number),
                 "--strategy", "canary", "--steps", '[{"weight": 50}, {"weight": 100}]',
                 "--verify-green", stdout=out)
    rollout = Rollout.objects.get(deployment=plan)
    assert rollout.verify_green
    assert f"rollout #{rollout.pk} started" in out.getvalue()
    entry = AuditEntry.objects.order_by("pk")[before:].get()
    assert entry.actor == AuditEntry.Actor.COMMAND and entry.action == "rollout.starting"
    call_command("rollout", "pause", str(rollout.pk), stdout=out)
    call_command("rollout", "list", plan.name, stdout=out)
    assert "paused" in out.getvalue()
    call_command("rollout", "status", str(rollout.pk), stdout=out)
    assert '"state": "paused"' in out.getvalue()
    with pytest.raises(CommandError, match="ROLLOUT_ID"):
        call_command("rollout", "pause", str(rollout.pk))
    call_command("rollout", "rollback", str(rollout.pk), stdout=out)
    with pytest.raises(CommandError, match="--revision"):
        call_command("rollout", "start", plan.name, "--revision", "99", "--strategy", "canary")
    with pytest.raises(CommandError, match="--steps"):
        call_command("rollout", "start", plan.name, "--revision", str(draft.number),
                     "--strategy", "canary", "--steps", "[")
    with pytest.raises(CommandError, match="DEPLOYMENT"):
        call_command("rollout", "rollback-deployment", "nowhere")
