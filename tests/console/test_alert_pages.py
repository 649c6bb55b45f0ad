"""The alert pages: buttons by role, silence and acknowledge from the page, the rule form's
errors (the API's, on the field) and its preview, the navigation count."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.accounts.models import Membership, Role
from console.alerts.models import Alert, AlertRule, Silence
from console.audit.models import AuditEntry
from console.deployments.models import Deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def firing(deployment: Deployment) -> Alert:
    rule = AlertRule.objects.get(deployment=deployment, key="worker_down")
    return Alert.objects.create(
        rule=rule, deployment=deployment, fingerprint="f1", state="firing", value=0.0,
        labels={"alertname": "WorkerDown", "deployment": deployment.name, "process": "decode-0"},
        annotations={"summary": "decode-0 is down"})


def _member(deployment: Deployment, role: Role) -> Client:
    user = User.objects.create_user(f"u-{role.value}", password="pw-long-enough-1")
    Membership.objects.create(team=deployment.team, user=user, role=role)
    client = Client()
    client.force_login(user)
    return client


def test_a_viewer_sees_the_alert_and_the_count_without_buttons(
        deployment: Deployment, firing: Alert) -> None:
    page = _member(deployment, Role.VIEWER).get("/alerts/").content.decode()
    assert "decode-0 is down" in page and 'id="nav-alert-count" class="alert-count">1<' in page
    assert "Acknowledge" not in page and 'class="silence"' not in page


def test_an_operator_silences_and_acknowledges_from_the_page(
        deployment: Deployment, firing: Alert) -> None:
    client = _member(deployment, Role.OPERATOR)
    assert 'class="silence"' in client.get("/alerts/").content.decode()
    response = client.post(f"/alerts/{firing.pk}/silence/", {"minutes": "30",
                                                             "comment": "restarting"})
    assert response.status_code == 302
    silence = Silence.objects.get()
    assert silence.matchers == [{"name": "alertname", "op": "=", "value": "WorkerDown"},
                                {"name": "deployment", "op": "=", "value": deployment.name},
                                {"name": "process", "op": "=", "value": "decode-0"}]
    assert f"silenced by #{silence.pk}" in client.get("/alerts/").content.decode()
    client.post(f"/alerts/{firing.pk}/acknowledge/", {"comment": "on it"})
    firing.refresh_from_db()
    assert firing.acknowledged_by.username == "u-operator" and firing.ack_comment == "on it"
    assert list(AuditEntry.objects.filter(action__in=["silence.create", "alert.acknowledge"])
                .values_list("action", flat=True).order_by("pk")) == ["silence.create",
                                                                       "alert.acknowledge"]


def _form(deployment: Deployment, **changes: str) -> dict[str, Any]:
    return {"deployment": str(deployment.pk), "name": "queue", "enabled": "on",
            "series": "worker.waiting", "role": "", "aggregation": "avg", "window_s": "60",
            "comparison": ">", "threshold": "4", "for_s": "0", "keep_firing_for_s": "0",
            "severity": "warning", "scope": "deployment", "labels": "{}", "summary": "",
            "runbook_url": "", "min_count": "0", "nodata": "nodata", "inhibits": "[]",
            **changes}


@pytest.mark.parametrize(("changes", "field", "says"), [
    ({"threshold": "nan"}, "threshold", "Enter a number"),
    ({"series": "worker.queue"}, "series", "not one of the available choices"),
    ({"series": "deployment.gate_failed", "window_s": "2"}, "window_s", "interval"),
    ({"for_s": "-1"}, "for_s", "greater than or equal to 0"),
])
def test_a_bad_rule_from_the_page_names_the_field_and_saves_nothing(
        deployment: Deployment, owner: User, changes: dict[str, str], field: str,
        says: str) -> None:
    client = Client()
    client.force_login(owner)
    before = AlertRule.objects.count()
    response = client.post("/alerts/rules/new/", _form(deployment, **changes))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors and says in " ".join(errors[field]), errors
    assert AlertRule.objects.count() == before


def test_the_rule_page_saves_and_previews(deployment: Deployment, owner: User) -> None:
    client = Client()
    client.force_login(owner)
    preview = client.post("/alerts/rules/preview/", _form(deployment)).json()
    [instance] = preview["instances"]
    [transition] = instance["transitions"]
    assert preview["series"] == "worker.waiting" and instance == {
        "role": "", "process": "", "transitions": [transition], "fired": 0, "points": []}
    # No snapshot at all: NoData from the hour's first evaluation on.
    assert transition == {"at": preview["from"], "from": "inactive", "to": "nodata",
                          "value": None}
    assert client.post("/alerts/rules/new/", _form(deployment)).status_code == 302
    assert AlertRule.objects.filter(deployment=deployment, name="queue").exists()
