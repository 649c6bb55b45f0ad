"""The autoscaling API: each pool's state, policies set whole, changed in part and removed, the
ratio band, and the decisions listed with filters and pages. Bad input is a 400 naming the field
and saves nothing; viewers read and change nothing; another team finds nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from console.accounts.models import Role, Team
from console.audit.models import AuditEntry
from console.autoscaling import decide, services
from console.autoscaling.models import SIGNAL_DEFAULTS, PoolPolicy, RatioBand, ScalingDecision
from console.deployments.models import Deployment, WorkerPlan
from console.supervisor.models import ManagedProcess
from tests.console.team_users import token_client
from tests.console.tiny_models import make_plan

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def team(db: None) -> Team:
    return Team.objects.create(name="scalers")


@pytest.fixture
def plan(team: Team, tmp_path: Path) -> Deployment:
    return make_plan(tmp_path, team=team)


@pytest.fixture
def colocated(team: Team, tmp_path: Path) -> Deployment:
    deployment = make_plan(tmp_path, name="solo", mode=Deployment.Mode.COLOCATED, team=team)
    for index, worker in enumerate(deployment.workers.order_by("pk")):
        WorkerPlan.objects.filter(pk=worker.pk).update(role=WorkerPlan.Role.COLOCATED,
                                                       index=index)
    return deployment


@pytest.fixture
def operator(team: Team) -> Client:
    return token_client(team, Role.OPERATOR, "op")


@pytest.fixture
def viewer(team: Team) -> Client:
    return token_client(team, Role.VIEWER, "vi")


@pytest.fixture
def stranger(db: None) -> Client:
    return token_client(Team.objects.create(name="other"), Role.ADMIN, "stranger")


def _url(deployment: Deployment, tail: str = "") -> str:
    return f"/api/v1/deployments/{deployment.pk}/autoscaling/{tail}"


def _send(client: Client, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    return getattr(client, method)(url, data=body or {}, content_type="application/json")


def _policy(**fields: Any) -> dict[str, Any]:
    return {"signal": "concurrency", "mode": "active", "min_instances": 1, "max_instances": 3,
            **fields}


def _saved(deployment: Deployment) -> list[dict[str, Any]]:
    return list(PoolPolicy.objects.filter(deployment=deployment).values())


def _entries(prefix: str = "autoscaling.") -> list[tuple[str, dict[str, Any]]]:
    return list(AuditEntry.objects.filter(action__startswith=prefix).order_by("pk")
                .values_list("action", "changes"))


# ---- policies ---------------------------------------------------------------------------------

def test_a_policy_put_whole_takes_its_signals_defaults(operator: Client, plan: Deployment
                                                       ) -> None:
    response = _send(operator, "put", _url(plan, "decode/"), _policy())
    assert response.status_code == 201, response.content
    body = response.json()
    up, down = SIGNAL_DEFAULTS["concurrency"]
    assert (body["role"], body["signal"], body["scale_up_at"], body["scale_down_at"]) == (
        "decode", "concurrency", up, down)
    policy = PoolPolicy.objects.get(deployment=plan, role="decode")
    assert (policy.mode, policy.max_instances) == ("active", 3)
    [(action, changes)] = _entries()
    assert action == "autoscaling.policy.create"
    assert changes["signal"] == [None, "concurrency"] and changes["max_instances"] == [None, 3]
    entry = AuditEntry.objects.get(action="autoscaling.policy.create")
    assert (entry.actor, entry.username, entry.team_id) == (AuditEntry.Actor.TOKEN, "op",
                                                            plan.team_id)
    # PUT again: the same policy changed, not a second one.
    again = _send(operator, "put", _url(plan, "decode/"), _policy(max_instances=4))
    assert again.status_code == 200
    assert PoolPolicy.objects.filter(deployment=plan).count() == 1
    assert _entries()[-1] == ("autoscaling.policy.update", {"max_instances": [3, 4]})


def test_a_new_signal_brings_its_own_thresholds_unless_given(operator: Client,
                                                             plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "decode/"), _policy())
    moved = _send(operator, "patch", _url(plan, "decode/"), {"signal": "kv_usage"})
    assert moved.status_code == 200
    assert (moved.json()["scale_up_at"], moved.json()["scale_down_at"]) == SIGNAL_DEFAULTS[
        "kv_usage"]
    given = _send(operator, "patch", _url(plan, "decode/"), {"signal": "queue",
                                                             "scale_up_at": 6})
    assert (given.json()["scale_up_at"], given.json()["scale_down_at"]) == (
        6, SIGNAL_DEFAULTS["queue"][1])


def test_patch_switches_the_mode_and_delete_removes_the_policy(operator: Client,
                                                               plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "prefill/"), _policy(signal="prompt_backlog"))
    response = _send(operator, "patch", _url(plan, "prefill/"), {"mode": "off"})
    assert response.status_code == 200 and response.json()["mode"] == "off"
    assert _entries()[-1] == ("autoscaling.policy.update", {"mode": ["active", "off"]})
    assert operator.get(_url(plan, "prefill/")).json()["mode"] == "off"
    deleted = operator.delete(_url(plan, "prefill/"))
    assert deleted.status_code == 204
    assert not PoolPolicy.objects.filter(deployment=plan).exists()
    assert _entries()[-1][0] == "autoscaling.policy.delete"
    assert operator.delete(_url(plan, "prefill/")).status_code == 404


def test_a_colocated_plan_has_the_colocated_pool(operator: Client, colocated: Deployment
                                                 ) -> None:
    response = _send(operator, "put", _url(colocated, "colocated/"), _policy(signal="queue"))
    assert response.status_code == 201, response.content
    pools = operator.get(_url(colocated)).json()["pools"]
    assert [(p["role"], p["current"]) for p in pools] == [("colocated", 2)]


@pytest.mark.parametrize(("method", "role", "body", "field", "says"), [
    ("put", "router", _policy(), "role", "has the pools prefill, decode, not 'router'"),
    ("put", "colocated", _policy(), "role", "not 'colocated'"),
    ("put", "Decode", _policy(), "role", "not 'Decode'"),
    ("patch", "1", {"mode": "off"}, "role", "not '1'"),
    ("put", "decode", _policy(signal="prompt_backlog"), "signal", "sizes a prefill pool"),
    ("put", "decode", _policy(signal="latency"), "signal", "not a valid choice"),
    ("put", "decode", {"mode": "active"}, "signal", "required"),
    ("patch", "decode", {"mode": "active"}, "role", "no decode policy yet"),
    ("put", "decode", _policy(scale_up_at=2, scale_down_at=2), "scale_down_at",
     "must be below scale_up_at"),
    ("put", "decode", _policy(scale_down_at=9), "scale_down_at", "must be below scale_up_at"),
    ("put", "decode", _policy(scale_up_at=-1), "scale_up_at", "greater than or equal to 0"),
    ("put", "decode", _policy(scale_up_at="NaN"), "scale_up_at", "valid number"),
    ("put", "decode", _policy(min_instances=3, max_instances=2), "max_instances",
     "at least min_instances (3)"),
    ("put", "decode", _policy(min_instances=0), "min_instances", "greater than or equal to 1"),
    ("put", "decode", _policy(max_instances=65), "max_instances", "less than or equal to 64"),
    ("put", "decode", _policy(max_step=0), "max_step", "greater than or equal to 1"),
    ("put", "decode", _policy(mode="on"), "mode", "not a valid choice"),
    ("put", "decode", _policy(schedules=[{"cron": "0 8 * * 8", "duration_s": 3600,
                                          "min_instances": 2}]),
     "schedules", "0.cron:"),
    ("put", "decode", _policy(schedules=[{"cron": "0 8 * * *", "duration_s": 3600,
                                          "min_instances": 2, "days": "weekdays"}]),
     "schedules", "0: unknown key(s) days"),
    ("put", "decode", _policy(schedules=[{"cron": "0 8 * * *", "duration_s": 3600,
                                          "min_instances": 5}]),
     "schedules", "0: min_instances 5 is above max_instances (3)"),
    ("put", "decode", _policy(schedules={"cron": "0 8 * * *"}), "schedules", "expected a list"),
])
def test_a_bad_policy_is_a_400_naming_the_field_and_nothing_is_saved(
        operator: Client, plan: Deployment, method: str, role: str, body: dict[str, Any],
        field: str, says: str) -> None:
    response = _send(operator, method, _url(plan, f"{role}/"), body)
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert says in " ".join(errors[field]), errors
    assert _saved(plan) == [] and _entries() == []


def test_a_bad_change_leaves_the_stored_policy_as_it_was(operator: Client,
                                                         plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "decode/"), _policy())
    stored, entries = _saved(plan), _entries()
    response = _send(operator, "patch", _url(plan, "decode/"),
                     {"max_instances": 5, "scale_up_at": 0.5})  # below the scale-down level
    assert response.status_code == 400 and "scale_down_at" in response.json()
    response = _send(operator, "patch", _url(plan, "decode/"), {"signal": "prompt_backlog"})
    assert response.status_code == 400 and "signal" in response.json()
    assert _saved(plan) == stored and _entries() == entries


# ---- the ratio band ---------------------------------------------------------------------------

def test_the_ratio_band_is_set_shown_and_removed(operator: Client, plan: Deployment) -> None:
    response = _send(operator, "put", _url(plan, "ratio-band/"),
                     {"min_ratio": 0.5, "max_ratio": 2})
    assert response.status_code == 200, response.content
    assert operator.get(_url(plan)).json()["ratio_band"] == {"min_ratio": 0.5, "max_ratio": 2.0}
    _send(operator, "put", _url(plan, "ratio-band/"), {"min_ratio": 1, "max_ratio": 2})
    assert RatioBand.objects.get(deployment=plan).min_ratio == 1.0
    assert operator.delete(_url(plan, "ratio-band/")).status_code == 204
    assert operator.get(_url(plan)).json()["ratio_band"] is None
    assert [action for action, _ in _entries()] == [
        "autoscaling.ratio_band.update", "autoscaling.ratio_band.update",
        "autoscaling.ratio_band.delete"]
    assert _entries()[1][1] == {"min_ratio": [0.5, 1.0]}


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"min_ratio": 2, "max_ratio": 1}, "max_ratio", "at least min_ratio (2)"),
    ({"min_ratio": 0, "max_ratio": 1}, "min_ratio", "greater than or equal to 0.01"),
    ({"min_ratio": 1, "max_ratio": 65}, "max_ratio", "less than or equal to 64"),
    ({"min_ratio": 1}, "max_ratio", "required"),
    ({"min_ratio": "Infinity", "max_ratio": 2}, "min_ratio", "valid number"),
])
def test_a_bad_ratio_band_is_a_400_naming_the_field(operator: Client, plan: Deployment,
                                                    body: dict[str, Any], field: str,
                                                    says: str) -> None:
    response = _send(operator, "put", _url(plan, "ratio-band/"), body)
    assert response.status_code == 400, response.content
    assert says in " ".join(response.json()[field]), response.json()
    assert not RatioBand.objects.exists() and _entries() == []


def test_a_colocated_plan_has_no_ratio_band(operator: Client, colocated: Deployment) -> None:
    response = _send(operator, "put", _url(colocated, "ratio-band/"),
                     {"min_ratio": 0.5, "max_ratio": 2})
    assert response.status_code == 400
    assert "needs a PD plan" in " ".join(response.json()["mode"])
    assert not RatioBand.objects.exists() and _entries() == []


# ---- who may -----------------------------------------------------------------------------------

def test_a_viewer_reads_and_changes_nothing(operator: Client, viewer: Client,
                                            plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "decode/"), _policy())
    _send(operator, "put", _url(plan, "ratio-band/"), {"min_ratio": 0.5, "max_ratio": 2})
    stored, entries = _saved(plan), _entries()
    assert viewer.get(_url(plan)).status_code == 200
    assert viewer.get(_url(plan, "decode/")).status_code == 200
    assert viewer.get(f"/api/v1/deployments/{plan.pk}/scaling-decisions/").status_code == 200
    for method, tail, body in [("put", "decode/", _policy(max_instances=5)),
                               ("put", "prefill/", _policy()),
                               ("patch", "decode/", {"mode": "off"}),
                               ("delete", "decode/", None),
                               ("put", "ratio-band/", {"min_ratio": 1, "max_ratio": 1}),
                               ("delete", "ratio-band/", None)]:
        response = _send(viewer, method, _url(plan, tail), body)
        assert response.status_code == 403, (method, tail, response.content)
    assert _saved(plan) == stored and _entries() == entries
    assert RatioBand.objects.get(deployment=plan).min_ratio == 0.5


def test_another_team_finds_nothing(operator: Client, stranger: Client,
                                    plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "decode/"), _policy())
    for method, tail in [("get", ""), ("get", "decode/"), ("patch", "decode/"),
                         ("delete", "decode/"), ("put", "ratio-band/")]:
        assert _send(stranger, method, _url(plan, tail), {}).status_code == 404, (method, tail)
    response = stranger.get(f"/api/v1/deployments/{plan.pk}/scaling-decisions/")
    assert response.status_code == 404
    assert PoolPolicy.objects.get(deployment=plan).mode == "active"


# ---- reading ----------------------------------------------------------------------------------

def _decision(deployment: Deployment, role: str, seconds: int, reason: str,
              action: str = "none", **fields: Any) -> ScalingDecision:
    at = T0 + timedelta(seconds=seconds)
    values: dict[str, Any] = {"signal": "queue", "value": 3.0, "current": 1, "desired": 2,
                              "target": 1 if action == "none" else 2, **fields}
    return ScalingDecision.objects.create(deployment=deployment, role=role, at=at, last_at=at,
                                          action=action, reason=reason, **values)


def test_the_pools_show_counts_ready_policy_and_latest_decision(operator: Client,
                                                                plan: Deployment) -> None:
    _send(operator, "put", _url(plan, "decode/"), _policy())
    ManagedProcess.objects.create(deployment=plan, slot="decode-0", role="decode", port=1,
                                  state=ManagedProcess.State.READY, log_path="/dev/null")
    _decision(plan, "decode", 5, decide.STABILIZING)
    latest = _decision(plan, "decode", 10, decide.CHANGED, "up", desired=3)
    body = operator.get(_url(plan)).json()
    pools = {p["role"]: p for p in body["pools"]}
    assert list(pools) == ["prefill", "decode"]
    decode, prefill = pools["decode"], pools["prefill"]
    assert (decode["current"], decode["ready"], decode["desired"]) == (1, 1, 3)
    assert decode["policy"]["signal"] == "concurrency"
    assert decode["latest"]["id"] == latest.pk and decode["latest"]["action"] == "up"
    assert (prefill["current"], prefill["ready"], prefill["desired"], prefill["policy"],
            prefill["latest"]) == (1, 0, None, None, None)
    assert body["ratio_band"] is None


def test_decisions_are_listed_newest_first_filtered_and_paged(operator: Client,
                                                              plan: Deployment) -> None:
    made = [_decision(plan, "decode", 5, decide.STABILIZING),
            _decision(plan, "decode", 10, decide.CHANGED, "up"),
            _decision(plan, "prefill", 15, decide.COOLDOWN),
            _decision(plan, "decode", 20, decide.CAPACITY)]
    url = f"/api/v1/deployments/{plan.pk}/scaling-decisions/"
    body = operator.get(url).json()
    newest_first = [d.pk for d in sorted(made, key=lambda d: d.at, reverse=True)]
    assert body["count"] == len(made)
    assert [row["id"] for row in body["results"]] == newest_first
    decode = operator.get(url, {"role": "decode"}).json()
    assert [row["id"] for row in decode["results"]] == [d.pk for d in sorted(
        (d for d in made if d.role == "decode"), key=lambda d: d.at, reverse=True)]
    refused = operator.get(url, {"reason": decide.CAPACITY}).json()
    assert [row["reason"] for row in refused["results"]] == [decide.CAPACITY]
    both = operator.get(url, {"role": "decode", "reason": decide.COOLDOWN}).json()
    assert both["count"] == 0
    page = operator.get(url, {"limit": 2, "offset": 2}).json()
    assert [row["id"] for row in page["results"]] == newest_first[2:4]
    assert page["next"] is None and page["previous"] is not None


@pytest.mark.parametrize(("params", "field"), [
    ({"role": "router"}, "role"),
    ({"reason": "bored"}, "reason"),
    ({"limit": 0}, "limit"),
    ({"offset": -1}, "offset"),
])
def test_a_bad_decision_filter_is_a_400_naming_it(operator: Client, plan: Deployment,
                                                  params: dict[str, Any], field: str) -> None:
    response = operator.get(f"/api/v1/deployments/{plan.pk}/scaling-decisions/", params)
    assert response.status_code == 400
    assert field in response.json(), response.json()


# ---- the service the page and the API share ---------------------------------------------------

@pytest.mark.parametrize(("values", "field"), [
    ({"schedules": [{"cron": "0 8 * * *", "duration_s": 3600, "min_instances": "2"}]},
     "schedules"),
    ({"schedules": 5}, "schedules"),
    ({"min_instances": None}, "min_instances"),
    ({"scale_up_at": None}, "scale_up_at"),
    ({"min_ratio": 1}, "min_ratio"),
])
def test_the_service_refuses_what_no_form_checked_naming_the_field(
        plan: Deployment, values: dict[str, Any], field: str) -> None:
    """A caller without a serializer or a form in front (a script, a command) gets the same
    ValidationError naming the field, not a TypeError, and nothing saved."""
    with pytest.raises(ValidationError) as caught:
        services.save_policy(plan, "decode", {"signal": "queue", **values})
    assert field in caught.value.message_dict, caught.value.message_dict
    assert _saved(plan) == [] and _entries() == []
