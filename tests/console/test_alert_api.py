"""The alerting API: rules (bad input named and nothing saved), the preview, silences,
acknowledgement, the rule file."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.alerts.models import Alert, AlertRule, Silence
from console.deployments.models import Deployment
from console.live.models import MetricSample

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def _rule(deployment: Deployment, **fields: Any) -> dict[str, Any]:
    return {"deployment": deployment.name, "name": "queue", "series": "worker.waiting",
            "aggregation": "avg", "window_s": 60, "comparison": ">", "threshold": 4, **fields}


def _post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, body, content_type="application/json")


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"series": "worker.queue_length"}, "series", "not a valid choice"),
    ({"aggregation": "p99"}, "aggregation", "not a valid choice"),
    ({"for_s": -5}, "for_s", "greater than or equal to 0"),
    ({"keep_firing_for_s": -1}, "keep_firing_for_s", "greater than or equal to 0"),
    ({"threshold": "NaN"}, "threshold", "valid number"),
    ({"threshold": "Infinity"}, "threshold", "valid number"),
    ({"window_s": 0}, "window_s", "interval"),
    ({"series": "deployment.gate_failed", "window_s": 3}, "window_s", "interval (5 s)"),
    ({"aggregation": "rate", "window_s": 1}, "window_s", "two points"),
    ({"role": "router"}, "role", "no role 'router'"),
    ({"series": "deployment.gate_failed", "scope": "instance", "window_s": 30}, "scope",
     "deployment series"),
    ({"min_count": 10}, "min_count", "only ratio series"),
    ({"labels": {"severity": "page"}}, "labels", "set by the evaluator"),
    ({"summary": "{deployment} at {when}"}, "summary", "unknown placeholder(s) when"),
    ({"inhibits": [{"name": "category", "op": "~", "value": "x"}]}, "inhibits", "op"),
])
def test_a_bad_rule_is_a_400_naming_the_field_and_nothing_is_saved(
        api: Client, deployment: Deployment, fields: dict[str, Any], field: str,
        says: str) -> None:
    before = AlertRule.objects.count()
    response = _post(api, "/api/v1/alert-rules/", _rule(deployment, **fields))
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert says in str(response.json()[field]), response.json()
    assert AlertRule.objects.count() == before


def test_a_rule_is_created_edited_and_listed(api: Client, deployment: Deployment) -> None:
    created = _post(api, "/api/v1/alert-rules/", _rule(deployment, role="decode",
                                                       scope="role"))
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["alertname"] == "Queue" and body["key"] == ""
    patched = api.patch(f"/api/v1/alert-rules/{body['id']}/", {"threshold": 9},
                        content_type="application/json")
    assert patched.status_code == 200 and patched.json()["threshold"] == 9
    listed = api.get("/api/v1/alert-rules/", {"deployment": deployment.name}).json()
    names = [rule["name"] for rule in listed["results"]]
    assert "queue" in names and "Worker down" in names


def test_the_preview_says_when_a_rule_would_have_fired(api: Client,
                                                       deployment: Deployment) -> None:
    now = timezone.now()
    for second in range(120):
        waiting = 10 if 40 <= second < 80 else 0
        MetricSample.objects.create(
            deployment=deployment, resolution=MetricSample.Resolution.SECOND,
            created=now - timedelta(seconds=120 - second),
            data={"processes": {"decode-0": {"role": "decode", "up": 1, "waiting": waiting}}})
    response = _post(api, "/api/v1/alert-rules/preview/", _rule(
        deployment, window_s=10, for_s=10, role="decode", scope="instance", nodata="ok"))
    assert response.status_code == 200, response.content
    [instance] = response.json()["instances"]
    assert instance["process"] == "decode-0" and instance["fired"] == 1
    states = [t["to"] for t in instance["transitions"]]
    assert states == ["pending", "firing", "inactive"]
    assert AlertRule.objects.filter(name="queue").count() == 0


def test_a_silence_is_made_and_expired(api: Client, deployment: Deployment) -> None:
    now = timezone.now()
    made = _post(api, "/api/v1/silences/", {
        "matchers": [{"name": "deployment", "op": "=", "value": deployment.name}],
        "starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat(),
        "comment": "upgrade"})
    assert made.status_code == 201, made.content
    assert made.json()["state"] == "active" and made.json()["created_by"] == "owner"
    expired = _post(api, f"/api/v1/silences/{made.json()['id']}/expire/", {})
    assert expired.json()["state"] == "expired"
    assert Silence.objects.get().expired_early_at is not None


@pytest.mark.parametrize(("body", "field"), [
    ({"matchers": []}, "matchers"),
    ({"matchers": [{"name": "9x", "value": "a"}]}, "matchers"),
    ({"matchers": [{"name": "a", "op": "=~", "value": "("}]}, "matchers"),
])
def test_a_bad_silence_is_a_400_naming_the_field(api: Client, body: dict[str, Any],
                                                 field: str) -> None:
    now = timezone.now()
    response = _post(api, "/api/v1/silences/", {
        "starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat(),
        "comment": "x", **body})
    assert response.status_code == 400 and field in response.json(), response.content
    assert not Silence.objects.exists()


def test_a_silence_ends_after_it_starts(api: Client) -> None:
    now = timezone.now()
    response = _post(api, "/api/v1/silences/", {
        "matchers": [{"name": "a", "value": "b"}], "starts_at": now.isoformat(),
        "ends_at": now.isoformat(), "comment": "x"})
    assert response.status_code == 400 and "ends_at" in response.json()


def test_an_alert_is_acknowledged_with_a_comment(api: Client, deployment: Deployment) -> None:
    rule = AlertRule.objects.get(deployment=deployment, key="worker_down")
    alert = Alert.objects.create(rule=rule, deployment=deployment, fingerprint="f",
                                 labels={"alertname": "WorkerDown"}, state="firing")
    response = _post(api, f"/api/v1/alerts/{alert.pk}/acknowledge/", {"comment": "on it"})
    assert response.status_code == 200, response.content
    assert response.json()["acknowledged_by"] == "owner"
    assert response.json()["ack_comment"] == "on it"
    filtered = api.get("/api/v1/alerts/", {"state": "firing", "severity": "critical"}).json()
    assert [a["id"] for a in filtered["results"]] == [alert.pk]
    assert api.get("/api/v1/alerts/", {"state": "burning"}).status_code == 400


def test_the_rule_file_is_yaml_with_one_group_per_deployment(api: Client,
                                                             deployment: Deployment) -> None:
    response = api.get(f"/api/v1/deployments/{deployment.pk}/alert-rules.yaml")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    groups = yaml.safe_load(response.content)["groups"]
    assert [g["name"] for g in groups] == [f"pdserve-{deployment.name}"]
    assert "WorkerDown" in {rule["alert"] for rule in groups[0]["rules"]}
