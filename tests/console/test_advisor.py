"""The topology advice of a deployment: from stored (synthetic) speeds, for two synthetic loads
the recommendation flips between colocated and PD; one call drafts the recommended topology and
starts a rollout to it (stored directly, no supervisor runs it); without speeds the advice says
so and offers the measurement; bad input is a 400 naming the field; roles."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from console.accounts.models import Role, Team
from console.advisor import services
from console.advisor.models import SpeedProfile
from console.advisor.summary import advice_lines, default_advice, topology_page
from console.audit.models import AuditEntry
from console.deployments.models import Deployment
from console.fleet.models import Node
from console.rollouts.models import Revision, Rollout
from tests.console.team_users import member, token_client
from tests.console.tiny_models import make_plan, make_startable

# A server whose prefill of a long prompt triples the cost of the decode steps it shares a
# step with (tests/unit/test_advisor_rank.py's speeds).
SPEEDS: dict[str, Any] = {
    "prefill_ms": {"tokens": [16, 4096], "ms": [10, 2000]},
    "decode_step_ms": {"batch": [1, 32], "ms": [20, 80]},
    "handoff_ms": {"tokens": [0, 4096], "ms": [5, 50]},
    "interference": {"tokens": [0, 2000], "factor": [1.0, 3.0]}}
# Short prompts and answers only: two colocated servers share the decoding; PD piles it on one.
SHORT = {"rate_per_s": "14", "prompt_tokens": "32", "output_tokens": "32"}
# Long documents beside a chat stream: only PD keeps the documents' prefills out of the chat's
# decode steps, which the TPOT SLO needs.
MIXED = {"rate_per_s": "4.3", "prompt_tokens": ",".join(["32"] * 14 + ["2000"]),
         "output_tokens": ",".join(["64"] * 14 + ["4"])}


@pytest.fixture
def team(db: None) -> Team:
    return Team.objects.create(name="advised")


@pytest.fixture
def plan(team: Team, tmp_path: Path) -> Deployment:
    deployment = make_startable(make_plan(tmp_path, team=team, ttft_slo_ms=1500, tpot_slo_ms=60))
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    # Two devices to place servers on, whatever machine runs the test.
    Node.objects.filter(pk=deployment.workers.first().node_id).update(cpu_ids=[0, 1])
    deployment.refresh_from_db()
    return deployment


@pytest.fixture
def measured(plan: Deployment) -> SpeedProfile:
    worker = plan.workers.get(role="decode")
    return SpeedProfile.objects.create(node=worker.node, variant=worker.variant,
                                       state=SpeedProfile.State.DONE, speeds=SPEEDS)


@pytest.fixture
def operator(team: Team) -> Client:
    return token_client(team, Role.OPERATOR, "op")


@pytest.fixture
def viewer(team: Team) -> Client:
    return token_client(team, Role.VIEWER, "vi")


def advice(client: Client, plan: Deployment, load: dict[str, str]) -> Any:
    return client.get(f"/api/v1/deployments/{plan.pk}/advice/", load)


def test_the_advice_flips_with_the_load(viewer: Client, plan: Deployment,
                                        measured: SpeedProfile) -> None:
    short = advice(viewer, plan, SHORT)
    assert short.status_code == 200, short.content
    body = short.json()
    assert body["status"] == "advised" and body["current"] == "PD 1P:1D"
    assert body["recommended"] == "colocated x2" and body["switch"] is True
    ranked = [c["topology"] for c in body["candidates"]]
    assert set(ranked) == {"colocated x1", "colocated x2", "PD 1P:1D"}
    current = next(c for c in body["candidates"] if c["current"])
    assert current["topology"] == "PD 1P:1D"
    assert body["candidates"][0]["goodput_rps"] > 2 * current["goodput_rps"]
    assert set(body["candidates"][0]["ttft_ms"]) == {"p50", "p90", "p99"}
    assert body["candidates"][0]["confidence"]["best_in"] == 3
    assert body["measurement"]["state"] == "done"

    mixed = advice(viewer, plan, MIXED).json()
    assert mixed["recommended"] == "PD 1P:1D" and mixed["switch"] is False
    assert mixed["candidates"][0]["current"] is True


def test_without_speeds_the_advice_offers_the_measurement(viewer: Client, plan: Deployment) -> None:
    body = advice(viewer, plan, SHORT).json()
    assert body["status"] == "not_measured" and body["candidates"] == []
    assert "measured yet" in body["detail"]
    assert body["measure"]["variant"] == plan.workers.get(role="decode").variant_id
    assert body["measurement"] is None
    # Said before any load is built: a plan never measured has often served nothing either.
    assert advice(viewer, plan, {"window": "day"}).json()["status"] == "not_measured"


def test_a_measurement_shown_done_is_one_the_advice_has_seen(
        viewer: Client, plan: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The measurement's task may finish while a GET builds the advice (CI: the live test read
    a done measurement beside a not_measured advice). The finish is placed right after the
    advice is built, the worst moment: the answer may be a step behind, never contradict."""
    worker = plan.workers.get(role="decode")
    running = SpeedProfile.objects.create(node=worker.node, variant=worker.variant,
                                          state=SpeedProfile.State.RUNNING)
    advice_for = services.advice_for

    def finished_meanwhile(*args: Any) -> dict[str, Any]:
        built = advice_for(*args)
        SpeedProfile.objects.filter(pk=running.pk).update(state=SpeedProfile.State.DONE,
                                                          speeds=SPEEDS)
        return built

    monkeypatch.setattr(services, "advice_for", finished_meanwhile)
    body = advice(viewer, plan, SHORT).json()
    assert (body["measurement"]["state"], body["status"]) == ("running", "not_measured"), body
    monkeypatch.undo()
    body = advice(viewer, plan, SHORT).json()
    assert (body["measurement"]["state"], body["status"]) == ("done", "advised"), body


def test_the_recorded_window_without_requests_is_a_400(viewer: Client, plan: Deployment,
                                                       measured: SpeedProfile) -> None:
    response = advice(viewer, plan, {"window": "day"})
    assert response.status_code == 400
    assert "window" in response.json()


@pytest.mark.parametrize(("load", "field"), [
    ({"window": "week"}, "window"),
    ({"rate_per_s": "-1", "prompt_tokens": "3", "output_tokens": "3"}, "rate_per_s"),
    ({"rate_per_s": "2", "prompt_tokens": "3,x", "output_tokens": "3"}, "prompt_tokens"),
    ({"rate_per_s": "2", "prompt_tokens": "3"}, "output_tokens"),
    ({"prompt_tokens": "3"}, "rate_per_s"),
])
def test_bad_load_is_a_400_naming_the_field(viewer: Client, plan: Deployment,
                                            load: dict[str, str], field: str) -> None:
    response = advice(viewer, plan, load)
    assert response.status_code == 400
    assert field in response.json(), response.json()


def test_one_call_drafts_the_recommendation_and_starts_its_rollout(
        operator: Client, plan: Deployment, measured: SpeedProfile) -> None:
    before = AuditEntry.objects.count()
    response = operator.post(f"/api/v1/deployments/{plan.pk}/advice/apply/", SHORT,
                             content_type="application/json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["topology"] == "colocated x2"
    revision = Revision.objects.get(deployment=plan, number=body["revision"])
    assert revision.spec["mode"] == "colocated"
    assert len(revision.spec["pools"]["colocated"]["instances"]) == 2
    assert set(revision.spec["pools"]) == {"colocated"}
    rollout = Rollout.objects.get(pk=body["rollout"])
    assert rollout.to_revision == revision and rollout.deployment == plan
    actions = list(AuditEntry.objects.order_by("pk")[before:].values_list("action", flat=True))
    assert actions[-2:] == ["revision.create", "rollout.starting"]


def test_nothing_is_applied_when_the_plan_is_the_best(operator: Client, plan: Deployment,
                                                      measured: SpeedProfile) -> None:
    response = operator.post(f"/api/v1/deployments/{plan.pk}/advice/apply/", MIXED,
                             content_type="application/json")
    assert response.status_code == 409
    assert "current plan already" in response.json()["advice"][0]
    assert not Rollout.objects.filter(deployment=plan).exists()
    assert not Revision.objects.filter(deployment=plan, state=Revision.State.DRAFT).exists()


def test_a_viewer_may_read_but_not_apply_or_measure(viewer: Client, plan: Deployment,
                                                    measured: SpeedProfile) -> None:
    for action in ("apply", "measure"):
        response = viewer.post(f"/api/v1/deployments/{plan.pk}/advice/{action}/", SHORT,
                               content_type="application/json")
        assert response.status_code == 403, action


def test_a_measurement_is_queued_once(operator: Client, plan: Deployment,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr("console.advisor.speed_runs.measure_speeds.delay", sent.append)
    url = f"/api/v1/deployments/{plan.pk}/advice/measure/"
    first = operator.post(url, content_type="application/json")
    assert first.status_code == 202, first.content
    assert first.json()["state"] == "queued"
    again = operator.post(url, content_type="application/json")
    assert again.status_code == 409 and "already being measured" in again.json()["variant"][0]
    assert AuditEntry.objects.filter(action="advisor.measure").count() == 1


def test_the_page_shows_the_candidates_and_the_button(plan: Deployment, measured: SpeedProfile,
                                                      team: Team) -> None:
    client = Client()
    client.force_login(member("page-op", team, Role.OPERATOR))
    page = client.get(f"/deployments/{plan.name}/topology/", SHORT)
    assert page.status_code == 200
    text = page.content.decode()
    assert "colocated x2" in text and 'id="apply-advice"' in text
    detail = client.get(f"/deployments/{plan.name}/")
    assert f"/deployments/{plan.name}/topology/" in detail.content.decode()


# ---- manage.py advise, and what manage.py up prints ----------------------------------------------

def _advise(*args: str) -> str:
    out = io.StringIO()
    call_command("advise", *args, stdout=out)
    return out.getvalue()


def _flags(load: dict[str, str]) -> list[str]:
    return ["--rate", load["rate_per_s"], "--prompt-tokens", load["prompt_tokens"],
            "--output-tokens", load["output_tokens"]]


def test_the_command_prints_the_advice_and_one_flag_switches_to_it(
        plan: Deployment, measured: SpeedProfile) -> None:
    printed = _advise(plan.name, *_flags(SHORT))
    assert "1. colocated x2" in printed and "<- recommended" in printed, printed
    assert re.search(r"\d\. PD 1P:1D .*<- current", printed), printed
    assert f"manage.py advise {plan.name} --apply" in printed
    assert f"/deployments/{plan.name}/topology/" in printed
    assert not Rollout.objects.filter(deployment=plan).exists()  # printing changes nothing

    before = AuditEntry.objects.count()
    applied = _advise(plan.name, *_flags(SHORT), "--apply")
    rollout = Rollout.objects.get(deployment=plan)
    assert rollout.to_revision.spec["mode"] == "colocated"
    assert f"rollout #{rollout.pk} (blue_green) started" in applied
    entries = list(AuditEntry.objects.order_by("pk")[before:])
    assert [e.action for e in entries][-2:] == ["revision.create", "rollout.starting"]
    assert {(e.actor, e.via) for e in entries} == {("command", "advise")}

    best = _advise(plan.name, *_flags(MIXED))
    assert "(PD 1P:1D) is the best for this load" in best
    with pytest.raises(CommandError, match="current plan already"):
        _advise(plan.name, *_flags(MIXED), "--apply")


def test_without_speeds_the_command_offers_the_measurement_and_queues_it_once(
        plan: Deployment, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    printed = _advise(plan.name)
    assert "measured yet" in printed and f"manage.py advise {plan.name} --measure" in printed
    sent: list[int] = []
    monkeypatch.setattr("console.advisor.speed_runs.measure_speeds.delay", sent.append)
    with django_capture_on_commit_callbacks(execute=True):
        queued = _advise(plan.name, "--measure")
    assert len(sent) == 1 and f"measurement #{sent[0]}" in queued
    with pytest.raises(CommandError, match="already being measured"):
        _advise(plan.name, "--measure")
    entry = AuditEntry.objects.get(action="advisor.measure")
    assert (entry.actor, entry.via) == ("command", "advise")


@pytest.mark.parametrize(("args", "flag"), [
    (["--rate", "-1"], "--rate"),
    (["--prompt-tokens", "3,x"], "--prompt-tokens"),
    (["--output-tokens", "0"], "--output-tokens"),
    (["--window", "day"], "--window"),  # nothing recorded
])
def test_bad_load_flags_are_named(plan: Deployment, measured: SpeedProfile, args: list[str],
                                  flag: str) -> None:
    with pytest.raises(CommandError, match=f"^{flag}: "):
        _advise(plan.name, *args)
    with pytest.raises(CommandError, match="no deployment named 'nowhere'"):
        _advise("nowhere")


def test_up_prints_the_advice_for_the_default_load(plan: Deployment,
                                                   measured: SpeedProfile) -> None:
    lines = advice_lines(plan, default_advice(plan), topology_page(plan))
    assert lines[0].startswith(f"topology advice for {plan.name} (synthetic: 1 req/s, prompts "
                               "64-1024 tokens, answers 32-256 tokens"), lines
    marked = [line for line in lines if "<- " in line]
    assert any("recommended" in line for line in marked), lines
    assert any("current" in line for line in marked), lines
    assert lines[-1].startswith(("  switch:", "  the current plan"))
