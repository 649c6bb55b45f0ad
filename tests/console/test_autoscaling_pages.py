"""The autoscaling page and the deployment page's events list: what each role sees and may
change, the policy forms' errors (nothing saved), and the hub source that carries stored
decisions and readings to both pages in the embedded mode."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.accounts.models import Membership, Role, Team
from console.audit.models import AuditEntry
from console.autoscaling.models import PoolPolicy, PoolReading, ScalingDecision
from console.autoscaling.scaling_socket import ScalingSource
from console.deployments.models import Deployment
from console.live.hub import SOURCES
from tests.console.tiny_models import make_plan


def _user(team: Team, name: str, role: Role) -> User:
    user = User.objects.create_user(name, "", "pw")
    Membership.objects.create(team=team, user=user, role=role)
    return user


@pytest.fixture
def world(db: None, tmp_path: Path) -> dict[str, Any]:
    team = Team.objects.create(name="scalers")
    plan = make_plan(tmp_path, name="scaled", team=team)
    policy = PoolPolicy.objects.create(deployment=plan, role="decode", mode="dry_run",
                                       signal="queue", min_instances=1, max_instances=3,
                                       scale_up_at=2.0, scale_down_at=0.5)
    return {"plan": plan, "policy": policy,
            "viewer": _user(team, "sviewer", Role.VIEWER),
            "operator": _user(team, "soperator", Role.OPERATOR),
            "stranger": _user(Team.objects.create(name="others"), "sstranger", Role.ADMIN)}


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _decision(plan: Deployment, at_s: float = 0.0, **fields: Any) -> ScalingDecision:
    at = timezone.now() - timedelta(seconds=at_s)
    values: dict[str, Any] = {
        "role": "decode", "signal": "queue", "value": 3.5, "current": 1, "desired": 2,
        "target": 2, "action": "up", "reason": "scaled", "detail": "asks for 2 over the window",
        "inputs": {"waiting": 3.5, "windows": {"up_s": 60, "down_s": 300}},
        "progress": {"decided_at": at.isoformat()}, **fields}
    return ScalingDecision.objects.create(deployment=plan, at=at, last_at=at, **values)


def _reading(plan: Deployment, value: float | None = 1.5) -> PoolReading:
    return PoolReading.objects.create(deployment=plan, role="decode", at=timezone.now(),
                                      value=value, asked=1, current=1, ready=1, scale_up_at=2.0,
                                      scale_down_at=0.5, mode="dry_run")


def _page_data(text: str, script_id: str) -> dict[str, Any]:
    found = re.search(rf'<script id="{script_id}" type="application/json">(.*?)</script>', text,
                      re.S)
    assert found, f"no {script_id} on the page"
    return dict(json.loads(found.group(1)))


def _switch(text: str, role: str) -> str:
    found = re.search(rf'<form[^>]*id="mode-{role}".*?</form>', text, re.S)
    assert found, f"no mode switch for {role}"
    return found.group(0)


def test_a_viewer_sees_the_pools_and_a_disabled_switch(world: dict[str, Any]) -> None:
    plan = world["plan"]
    decision = _decision(plan, dry_run=True)
    reading = _reading(plan)
    url = f"/deployments/{plan.name}/autoscaling/"
    response = _client(world["viewer"]).get(url)
    assert response.status_code == 200
    text = response.content.decode()
    assert 'id="pool-prefill"' in text and 'id="pool-decode"' in text
    assert 'id="policy-prefill"' in text and "No policy" in text
    assert "dry run (decisions are recorded, nothing changes)" in text
    assert 'id="pool-decode-desired">2<' in text and 'id="pool-decode-current">1<' in text
    for role in ("prefill", "decode"):
        buttons = re.findall(r"<button[^>]*>", _switch(text, role), re.S)
        assert len(buttons) == 3 and all("disabled" in b for b in buttons), buttons
    assert 'class="selected" aria-pressed="true"' in _switch(text, "decode")
    assert "policy-form-" not in text  # no edit form for a viewer
    data = _page_data(text, "autoscaling-data")
    assert [d["id"] for d in data["decisions"]] == [decision.pk]
    assert data["decisions"][0]["dry_run"] is True
    assert [r["value"] for r in data["readings"]] == [reading.value]
    assert "uPlot.iife.min.js" in text and "pdserve/autoscaling.js" in text

    assert _client(world["stranger"]).get(url).status_code == 404
    assert _client(world["viewer"]).post(url + "decode/mode/",
                                         {"mode": "active"}).status_code == 403
    assert _client(world["viewer"]).post(url + "decode/", {"signal": "queue"}).status_code == 403
    assert PoolPolicy.objects.get(pk=world["policy"].pk).mode == "dry_run"


def test_an_operator_switches_the_mode_with_an_audit_entry(world: dict[str, Any]) -> None:
    plan = world["plan"]
    client = _client(world["operator"])
    page = client.get(f"/deployments/{plan.name}/autoscaling/").content.decode()
    assert "disabled" not in _switch(page, "decode")
    assert 'id="policy-form-decode"' in page and 'id="policy-form-prefill"' in page

    switched = client.post(f"/deployments/{plan.name}/autoscaling/decode/mode/",
                           {"mode": "active"})
    assert switched.status_code == 302
    assert switched["Location"] == f"/deployments/{plan.name}/autoscaling/"
    assert PoolPolicy.objects.get(pk=world["policy"].pk).mode == "active"
    entry = AuditEntry.objects.get(action="autoscaling.policy.update")
    assert entry.username == "soperator" and entry.changes == {"mode": ["dry_run", "active"]}
    assert entry.team_id == plan.team_id


def test_an_operator_makes_a_policy_whose_blank_thresholds_are_the_signals(
        world: dict[str, Any]) -> None:
    plan = world["plan"]
    made = _client(world["operator"]).post(f"/deployments/{plan.name}/autoscaling/prefill/", {
        "mode": "dry_run", "signal": "prompt_backlog", "min_instances": "1",
        "max_instances": "2", "scale_up_at": "", "scale_down_at": "", "up_window_s": "30",
        "down_window_s": "120", "max_step": "1", "cooldown_s": "60",
        "schedules": '[{"name": "peak", "cron": "0 8 * * 1-5", "duration_s": 3600, '
                     '"min_instances": 2}]'})
    assert made.status_code == 302
    policy = PoolPolicy.objects.get(deployment=plan, role="prefill")
    assert (policy.signal, policy.scale_up_at, policy.scale_down_at) == ("prompt_backlog", 2.0,
                                                                         0.5)
    assert policy.schedules[0]["name"] == "peak"
    entry = AuditEntry.objects.get(action="autoscaling.policy.create")
    assert entry.username == "soperator" and entry.changes["signal"] == [None, "prompt_backlog"]


def _form(**changes: str) -> dict[str, str]:
    return {"mode": "dry_run", "signal": "queue", "min_instances": "1", "max_instances": "2",
            "scale_up_at": "2", "scale_down_at": "0.5", "up_window_s": "60",
            "down_window_s": "300", "max_step": "1", "cooldown_s": "300", "schedules": "[]",
            **changes}


@pytest.mark.parametrize(("role", "changes", "field", "message"), [
    # the policy as a whole (the model's clean), through services.save_policy
    ("decode", {"min_instances": "3", "max_instances": "2"}, "max_instances",
     "must be at least min_instances (3)"),
    ("decode", {"scale_down_at": "2"}, "scale_down_at", "must be below scale_up_at (2)"),
    # a pool's signal (services.save_policy)
    ("decode", {"signal": "prompt_backlog"}, "signal", "the prompt backlog sizes a prefill pool"),
    # the schedules' validator (the model's field)
    ("prefill", {"schedules": '[{"name": "x", "cron": "not a cron"}]'}, "schedules",
     "0.cron: 'not a cron' is not a cron expression"),
    # the form itself
    ("prefill", {"schedules": "[{"}, "schedules", "Enter a valid JSON."),
    ("prefill", {"min_instances": "two"}, "min_instances", "Enter a whole number."),
])
def test_bad_policy_input_shows_the_field_error_and_saves_nothing(
        world: dict[str, Any], role: str, changes: dict[str, str], field: str,
        message: str) -> None:
    plan = world["plan"]
    before = list(PoolPolicy.objects.values())
    response = _client(world["operator"]).post(f"/deployments/{plan.name}/autoscaling/{role}/",
                                               _form(**changes))
    assert response.status_code == 400
    text = response.content.decode()
    found = re.search(rf'<label class="field has-error">\s*<span class="field-label">[^<]*'
                      rf'</span>\s*<[^>]*id="{role}-{field}"[^>]*>.*?</label>', text, re.S)
    assert found, f"no error on {role}-{field}"
    errors = re.findall(r'<span class="field-error">(.*?)</span>', found.group(0), re.S)
    assert errors and message in " ".join(errors).replace("&#x27;", "'"), errors
    assert "<details class=\"policy-edit\" open>" in text
    assert list(PoolPolicy.objects.values()) == before
    assert not AuditEntry.objects.filter(action__startswith="autoscaling.").exists()


def test_a_switch_without_a_policy_or_pool_changes_nothing(world: dict[str, Any]) -> None:
    plan = world["plan"]
    client = _client(world["operator"])
    refused = client.post(f"/deployments/{plan.name}/autoscaling/prefill/mode/",
                          {"mode": "active"})
    assert refused.status_code == 400
    assert re.search(r'id="mode-prefill-errors">[^<]*has no prefill policy yet',
                     refused.content.decode())
    bad = client.post(f"/deployments/{plan.name}/autoscaling/decode/mode/", {"mode": "on"})
    assert bad.status_code == 400 and "mode-decode-errors" in bad.content.decode()
    assert client.post(f"/deployments/{plan.name}/autoscaling/colocated/mode/",
                       {"mode": "off"}).status_code == 404
    assert client.post(f"/deployments/{plan.name}/autoscaling/colocated/",
                       _form()).status_code == 404
    assert PoolPolicy.objects.get(pk=world["policy"].pk).mode == "dry_run"
    assert not PoolPolicy.objects.filter(role="prefill").exists()
    assert not AuditEntry.objects.filter(action__startswith="autoscaling.").exists()


def test_the_deployment_page_lists_the_last_ten_decisions(world: dict[str, Any]) -> None:
    plan = world["plan"]
    made = [_decision(plan, at_s=60 - i) for i in range(12)]
    text = _client(world["viewer"]).get(f"/deployments/{plan.name}/").content.decode()
    assert "Autoscaling events" in text and 'id="scaling-events-table"' in text
    assert f'href="/deployments/{plan.name}/autoscaling/"' in text
    assert f'data-scaling-ws="/ws/deployments/{plan.pk}/live/"' in text
    data = _page_data(text, "scaling-events-data")
    assert [d["id"] for d in data["decisions"]] == [d.pk for d in reversed(made)][:10]
    assert "pdserve/autoscaling.js" in text


def test_the_hub_source_carries_new_and_changed_rows(world: dict[str, Any]) -> None:
    plan = world["plan"]
    assert ScalingSource in SOURCES
    group = f"deployment-{plan.pk}"
    old = _decision(plan, at_s=30)
    _reading(plan)
    source = ScalingSource()
    source.start_from_now()
    assert source.fetch() == []  # what was stored before the hub started is backfilled by pages

    reading = _reading(plan, value=None)
    decision = _decision(plan, reason="stabilizing", action="none", target=1)
    messages = source.fetch()
    assert [(g, m["type"]) for g, m in messages] == [(group, "scaling.reading"),
                                                     (group, "scaling.decision")]
    assert messages[0][1]["reading"]["value"] is None
    assert messages[0][1]["reading"]["at"] == reading.at.isoformat()
    assert messages[1][1]["decision"]["id"] == decision.pk
    assert messages[1][1]["decision"]["reason"] == "stabilizing"
    assert source.fetch() == []

    # The autoscaler extends a decision and follows a change's progress on the stored row.
    decision.evaluations = 2
    decision.save()
    old.progress = {**old.progress, "decode_1_ready_at": timezone.now().isoformat()}
    old.save()
    changed = source.fetch()
    assert [(g, m["decision"]["id"]) for g, m in changed] == [(group, decision.pk),
                                                              (group, old.pk)]
    assert changed[0][1]["decision"]["evaluations"] == 2
    assert "decode_1_ready_at" in changed[1][1]["decision"]["progress"]
    assert source.fetch() == []


def test_the_hub_source_starts_on_empty_tables(world: dict[str, Any]) -> None:
    source = ScalingSource()
    source.start_from_now()
    decision = _decision(world["plan"])
    assert [m["decision"]["id"] for _g, m in source.fetch()] == [decision.pk]
