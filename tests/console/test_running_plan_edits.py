"""A plan edit of a running deployment: a revision field or a role's variant changed makes a draft
revision (a 202 in the API, the revisions page in the browser) and leaves the running plan as it
was; a live edit (instances, ports, devices, router settings) is applied as before; an edit with
both applies the live part and drafts the rest; a stopped deployment's plan is edited in place."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from console.audit.models import AuditEntry
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.rollouts import revisions
from console.rollouts.models import Revision
from tests.console.tiny_models import make_plan, make_startable, register
from tests.console.tokens import token_for


@pytest.fixture
def admin(db: None) -> User:
    return User.objects.create_superuser(username="root", email="", password="pw")


@pytest.fixture
def api(admin: User) -> Client:
    return Client(headers={"Authorization": f"Token {token_for(admin)}"})


@pytest.fixture
def browser(admin: User) -> Client:
    client = Client()
    client.force_login(admin)
    return client


@pytest.fixture
def plan(db: None, tmp_path: Path) -> Deployment:
    deployment = make_startable(make_plan(tmp_path))
    revisions.ensure_live(deployment)
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    deployment.refresh_from_db()
    return deployment


@pytest.fixture
def w8a8(plan: Deployment, tmp_path: Path) -> Variant:
    variant = register(plan.base_model, tmp_path, "w8a8")
    assert variant.pk != plan.workers.get(role="decode").variant_id
    return variant


def _put_body(deployment: Deployment, **changes: Any) -> dict[str, Any]:
    """The plan as stored, in the API's shape (every port given), with ``changes``."""
    pools: dict[str, Any] = {}
    for worker in deployment.workers.order_by("role", "index"):
        pool = pools.setdefault(worker.role, {"variant": worker.variant_id, "instances": []})
        pool["instances"].append({"node": worker.node.name, "cpu_cores": worker.cpu_cores,
                                  "gpu_indices": worker.gpu_indices, "port": worker.port,
                                  "side_channel_port": worker.side_channel_port})
    body = {"name": deployment.name, "base_model": deployment.base_model.name,
            "served_model_name": deployment.served_model_name,
            "max_model_len": deployment.max_model_len,
            "longest_request": deployment.longest_request,
            "kv_cache_gib": deployment.kv_cache_gib, "dtype": deployment.dtype,
            "engine_version": deployment.engine_version,
            "sampling_defaults": deployment.sampling_defaults,
            "router": {"port": deployment.router_port}, **pools}
    body.update(changes)
    return body


def _send(client: Client, method: str, deployment: Deployment, body: dict[str, Any]) -> Any:
    return getattr(client, method)(f"/api/v1/deployments/{deployment.pk}/", data=body,
                                   content_type="application/json")


def _state(deployment: Deployment) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan's revision snapshot and its full record, as stored now."""
    from console.control.lifecycle import plan_record

    fresh = Deployment.objects.get(pk=deployment.pk)
    return revisions.snapshot(fresh), plan_record(fresh)


def _actions(since: int) -> list[str]:
    return list(AuditEntry.objects.order_by("pk")[since:].values_list("action", flat=True))


@pytest.mark.parametrize("method", ["put", "patch"])
def test_changing_sampling_defaults_makes_a_draft_and_leaves_the_plan(
        api: Client, plan: Deployment, method: str) -> None:
    before, audit = _state(plan), AuditEntry.objects.count()
    change = {"sampling_defaults": {"temperature": 0.7}}
    body = _put_body(plan, **change) if method == "put" else change
    response = _send(api, method, plan, body)
    assert response.status_code == 202, response.content
    answer = response.json()
    assert answer["draft_revision"]["number"] == 2
    assert answer["draft_revision"]["changes"] == {
        "sampling_defaults": [{"temperature": 0}, {"temperature": 0.7}]}
    assert answer["draft_revision"]["checks"]["ok"] is True
    assert answer["live_edits_applied"] is False
    assert "POST /api/v1/rollouts/" in answer["detail"] and "r2" in answer["detail"]
    assert _state(plan) == before
    draft = Revision.objects.get(deployment=plan, number=2)
    assert draft.state == Revision.State.DRAFT
    assert draft.spec["sampling_defaults"] == {"temperature": 0.7}
    assert revisions.live(plan).number == 1
    assert _actions(audit) == ["revision.create"]


def test_a_decode_variant_change_makes_a_draft_of_it(api: Client, plan: Deployment,
                                                     w8a8: Variant) -> None:
    before, audit = _state(plan), AuditEntry.objects.count()
    body = _put_body(plan)
    body["decode"]["variant"] = w8a8.pk
    response = _send(api, "put", plan, body)
    assert response.status_code == 202, response.content
    changes = response.json()["draft_revision"]["changes"]
    assert list(changes) == ["variant.decode"] and changes["variant.decode"][1] == str(w8a8)
    assert _state(plan) == before
    draft = Revision.objects.get(deployment=plan, number=2)
    assert draft.spec["pools"]["decode"]["variant"] == w8a8.pk
    assert draft.spec["pools"]["prefill"] == revisions.live(plan).spec["pools"]["prefill"]
    assert _actions(audit) == ["revision.create"]


def test_a_pure_live_edit_is_applied_with_no_revision(api: Client, plan: Deployment) -> None:
    audit = AuditEntry.objects.count()
    response = _send(api, "patch", plan, {"router": {"decode_policy": "round_robin"},
                                          "concurrency": 3})
    assert response.status_code == 200, response.content
    plan.refresh_from_db()
    assert (plan.decode_policy, plan.concurrency) == ("round_robin", 3)
    assert list(plan.revisions.values_list("number", flat=True)) == [1]
    assert _actions(audit) == ["deployment.edit"]


def _add_decode(body: dict[str, Any]) -> None:
    """A second decode instance, sharing the first's core (the test machine may have two)."""
    first = body["decode"]["instances"][0]
    first["share_devices"] = True
    body["decode"]["instances"].append({"cpu_cores": first["cpu_cores"], "share_devices": True})


def test_an_added_instance_is_a_live_edit(api: Client, plan: Deployment) -> None:
    body = _put_body(plan)
    _add_decode(body)
    response = _send(api, "put", plan, body)
    assert response.status_code == 200, response.content
    assert plan.workers.filter(role="decode").count() == 2
    assert list(plan.revisions.values_list("number", flat=True)) == [1]


def test_a_mixed_edit_applies_the_live_part_and_drafts_the_rest(api: Client, plan: Deployment,
                                                                w8a8: Variant) -> None:
    audit = AuditEntry.objects.count()
    body = _put_body(plan, block_size=32, concurrency=3)
    body["decode"]["variant"] = w8a8.pk
    _add_decode(body)
    response = _send(api, "put", plan, body)
    assert response.status_code == 202, response.content
    answer = response.json()
    assert answer["live_edits_applied"] is True
    assert set(answer["draft_revision"]["changes"]) == {"block_size", "variant.decode"}
    plan.refresh_from_db()
    assert plan.concurrency == 3 and plan.block_size != 32
    decode = list(plan.workers.filter(role="decode"))
    assert len(decode) == 2 and {w.variant_id for w in decode} != {w8a8.pk}
    draft = Revision.objects.get(deployment=plan, number=2)
    assert len(draft.spec["pools"]["decode"]["instances"]) == 2  # laid out as the plan now is
    assert draft.spec["pools"]["decode"]["variant"] == w8a8.pk
    assert _actions(audit) == ["deployment.edit", "revision.create"]


def test_a_mixed_edit_whose_draft_is_invalid_saves_nothing(api: Client, plan: Deployment) -> None:
    before, audit = _state(plan), AuditEntry.objects.count()
    response = _send(api, "patch", plan, {"concurrency": 3, "block_size": 7})
    assert response.status_code == 400, response.content
    assert _state(plan) == before and AuditEntry.objects.count() == audit
    assert list(plan.revisions.values_list("number", flat=True)) == [1]


def test_a_mode_change_drafts_the_new_modes_variant(api: Client, plan: Deployment) -> None:
    before = _state(plan)
    variant = plan.workers.get(role="decode").variant_id
    response = _send(api, "patch", plan, {"mode": "colocated", "colocated": {
        "variant": variant, "instances": [{}]}})
    assert response.status_code == 202, response.content
    changes = response.json()["draft_revision"]["changes"]
    assert changes["mode"] == ["pd", "colocated"]
    assert set(changes) == {"mode", "variant.prefill", "variant.decode", "variant.colocated"}
    assert _state(plan) == before
    two = _send(api, "patch", plan, {"mode": "colocated", "colocated": {
        "variant": variant, "instances": [{}, {}]}})
    assert two.status_code == 400 and "colocated" in two.json(), two.content
    assert list(plan.revisions.values_list("number", flat=True)) == [2, 1]


def test_a_stopped_deployments_edit_applies_in_place(api: Client, plan: Deployment) -> None:
    Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.STOPPED)
    response = _send(api, "patch", plan, {"sampling_defaults": {"temperature": 0.7}})
    assert response.status_code == 200, response.content
    plan.refresh_from_db()
    assert plan.sampling_defaults == {"temperature": 0.7}
    assert list(plan.revisions.values_list("number", flat=True)) == [1]


class _Inputs(HTMLParser):
    """The values a browser would submit from the edit form."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        name = attr.get("name", "")
        if tag == "input" and name and attr.get("type") not in ("submit", "button"):
            if attr.get("type") == "checkbox":
                if "checked" in attr:
                    self.values[name] = attr.get("value") or "on"
            else:
                self.values[name] = attr.get("value", "")
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in attr:
            self.values[self._select] = attr.get("value", "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            # A browser drops the newline that follows <textarea>.
            value = self.values[self._textarea]
            self.values[self._textarea] = value[1:] if value.startswith("\n") else value
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea] += data


def _form(browser: Client, deployment: Deployment) -> dict[str, str]:
    page = browser.get(f"/deployments/{deployment.name}/edit/")
    assert page.status_code == 200
    parser = _Inputs()
    parser.feed(page.content.decode())
    return parser.values


def test_the_form_makes_a_draft_and_shows_the_revisions_page(browser: Client,
                                                             plan: Deployment) -> None:
    before, audit = _state(plan), AuditEntry.objects.count()
    data = {**_form(browser, plan), "sampling_defaults": '{"temperature": 0.7}'}
    response = browser.post(f"/deployments/{plan.name}/edit/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert response["Location"] == f"/deployments/{plan.name}/revisions/"
    [message] = [str(m) for m in get_messages(response.wsgi_request)]
    assert "draft revision r2" in message and "sampling_defaults" in message
    assert _state(plan) == before
    assert Revision.objects.get(deployment=plan, number=2).spec["sampling_defaults"] == {
        "temperature": 0.7}
    assert _actions(audit) == ["revision.create"]
    page = browser.get(response["Location"])
    assert "draft revision r2" in page.content.decode()


def test_the_form_applies_a_live_edit(browser: Client, plan: Deployment) -> None:
    data = {**_form(browser, plan), "decode_policy": "round_robin"}
    response = browser.post(f"/deployments/{plan.name}/edit/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert response["Location"] == f"/deployments/{plan.name}/"
    plan.refresh_from_db()
    assert plan.decode_policy == "round_robin"
    assert list(plan.revisions.values_list("number", flat=True)) == [1]


def test_the_form_edits_a_stopped_plan_in_place(browser: Client, plan: Deployment) -> None:
    Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.STOPPED)
    data = {**_form(browser, plan), "sampling_defaults": '{"temperature": 0.7}'}
    response = browser.post(f"/deployments/{plan.name}/edit/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert response["Location"] == f"/deployments/{plan.name}/"
    plan.refresh_from_db()
    assert plan.sampling_defaults == {"temperature": 0.7}
    assert list(plan.revisions.values_list("number", flat=True)) == [1]


def test_a_running_plan_out_of_step_with_its_live_revision_becomes_it(
        api: Client, plan: Deployment) -> None:
    """A plan edited in place while running (before such edits became drafts) is what the
    workers run: a live edit makes it the live revision, and the live edit is applied."""
    Deployment.objects.filter(pk=plan.pk).update(sampling_defaults={"temperature": 0.2})
    audit = AuditEntry.objects.count()
    response = _send(api, "patch", plan, {"concurrency": 3})
    assert response.status_code == 200, response.content
    live = revisions.live(plan)
    assert live.number == 2 and live.spec["sampling_defaults"] == {"temperature": 0.2}
    assert _actions(audit) == ["revision.create", "deployment.edit"]


def test_the_202_has_the_schemas_shape(api: Client, plan: Deployment) -> None:
    schema = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml")
                            .read_text())["components"]["schemas"]
    response = _send(api, "patch", plan, {"block_size": 32})
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) == set(schema["PlanEditDrafted"]["properties"])
    assert set(body["draft_revision"]) == set(schema["PlanEditDraft"]["properties"])
