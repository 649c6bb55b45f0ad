"""Per-model limits and token budgets in the console: the keys API and page take them (400 naming
the field when wrong), teams' budgets have their own API, the spend comes from the stored usage
(per period, per deployment), and the key set each router is told carries it, which the key sync
pushes again once a ledger read changed it."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.accounts.models import Membership, Role, Team
from console.audit.models import AuditEntry
from console.deployments.models import Deployment
from console.gateway.budgets import spend
from console.gateway.models import ApiKey, TeamBudget, UsageDay
from console.gateway.services import key_set, keys_file_path
from console.gateway.sync import KeySync
from console.supervisor.models import ManagedProcess
from inference.router.budgets import periods
from inference.router.keys import parse_key_set
from tests.console.passwords import OWNER_PASSWORD
from tests.console.test_usage import AdminStub, _AdminHandler, ledger_row
from tests.console.tiny_models import make_plan

URL = "/api/v1/keys/"
TEAMS_URL = "/api/v1/team-budgets/"
OnCommit = Callable[..., Any]
NOW = datetime.now(UTC)
TODAY = NOW.date()


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR)


def create(api: APIClient, **fields: Any) -> Any:
    return api.post(URL, {"name": "ci", "all_deployments": True, **fields}, format="json")


def usage(deployment: Deployment, key: ApiKey, day: date, prompt: int, completion: int,
          name: str = "") -> UsageDay:
    """A day of the key's use of a deployment, as the key sync stores a router's ledger."""
    return UsageDay.objects.create(
        day=day, deployment=deployment, deployment_name=name or deployment.name, key=key,
        router_key=str(key.pk), key_prefix=key.prefix, team=key.team,
        model=deployment.served_model_name, requests=1, prompt_tokens=prompt,
        completion_tokens=completion)


# ---- the keys API and page ----------------------------------------------------------------------

def test_a_key_takes_model_limits_and_a_budget(api: APIClient, deployment: Deployment) -> None:
    served = deployment.served_model_name
    response = create(api, requests_per_minute=60,
                      model_limits={served: {"requests_per_minute": 5, "max_concurrency": None}},
                      budget_tokens=1_000_000, budget_period="day")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["model_limits"] == {served: {"requests_per_minute": 5, "max_concurrency": None}}
    assert body["budget_tokens"] == 1_000_000 and body["budget_period"] == "day"
    assert body["budget_spent"] == 0
    day, _month = periods(NOW.timestamp())
    assert body["budget_renews_at"] == datetime.fromtimestamp(
        day.renews_at, tz=UTC).isoformat().replace("+00:00", "Z")

    key = ApiKey.objects.get()
    usage(deployment, key, TODAY, 300, 40)
    listed = api.get(f"{URL}{key.pk}/").json()
    assert listed["budget_spent"] == 340

    changed = api.patch(f"{URL}{key.pk}/", {"model_limits": {}, "budget_tokens": None},
                        format="json")
    assert changed.status_code == 200, changed.content
    key.refresh_from_db()
    assert key.model_limits == {} and key.budget_tokens is None
    assert changed.json()["budget_spent"] is None
    entry = AuditEntry.objects.filter(action="key.edit").get()
    assert "model_limits" in entry.changes and "budget_tokens" in entry.changes


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"model_limits": {"nope": {"requests_per_minute": 5}}}, "model_limits",
     "serves model 'nope'"),
    ({"model_limits": {"{served}": {"rpm": 5}}}, "model_limits", "'rpm' is not a limit"),
    ({"model_limits": {"{served}": {"requests_per_minute": 0}}}, "model_limits",
     "an integer from 1"),
    ({"model_limits": {"{served}": {}}}, "model_limits", "one or more of"),
    ({"model_limits": ["big"]}, "model_limits", "expected an object"),
    ({"budget_tokens": 0}, "budget_tokens", ""),
    ({"budget_tokens": 5, "budget_period": "week"}, "budget_period", ""),
])
def test_bad_limits_and_budgets_are_400_naming_the_field(
        api: APIClient, deployment: Deployment, fields: dict[str, Any], field: str,
        words: str) -> None:
    served = deployment.served_model_name
    fields = json.loads(json.dumps(fields).replace("{served}", served))
    response = create(api, **fields)
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert words in " ".join(response.json()[field])
    assert not ApiKey.objects.exists()
    # The same on a change.
    key = create(api).json()
    response = api.patch(f"{URL}{key['id']}/", fields, format="json")
    assert response.status_code == 400 and field in response.json()


def test_the_page_makes_a_key_with_them_and_shows_the_spend(
        owner: User, deployment: Deployment) -> None:
    client = Client()
    assert client.login(username="owner", password=OWNER_PASSWORD)
    served = deployment.served_model_name
    made = client.post("/keys/new/", {
        "name": "batch", "deployments": [deployment.name], "budget_tokens": "5000",
        "budget_period": "month",
        "model_limits": json.dumps({served: {"generated_tokens_per_minute": 100}})})
    assert made.status_code == 201, made.content.decode()[-2000:]
    key = ApiKey.objects.get()
    assert key.model_limits == {served: {"generated_tokens_per_minute": 100}}
    assert key.budget_tokens == 5000 and key.budget_period == "month"
    usage(deployment, key, TODAY, 1000, 234)
    page = client.get("/keys/").content.decode()
    assert "1234 of 5000 per month" in page
    assert "generated_tokens_per_minute 100" in page

    # Without a budget the period may be left out; a misspelt model is a 400 on the field.
    plain = client.post("/keys/new/", {"name": "plain", "deployments": [deployment.name]})
    assert plain.status_code == 201
    assert ApiKey.objects.get(name="plain").budget_period == "month"
    refused = client.post("/keys/new/", {"name": "bad", "deployments": [deployment.name],
                                         "model_limits": '{"nope": {"max_concurrency": 1}}'})
    assert refused.status_code == 400 and "serves model &#x27;nope&#x27;" in refused.content.decode()


# ---- teams' budgets ------------------------------------------------------------------------------

def test_a_team_admin_sets_reads_and_removes_a_team_budget(
        db: None, deployment: Deployment) -> None:
    team = deployment.team
    admin = User.objects.create_user(username="lead")
    operator = User.objects.create_user(username="ops")
    Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    Membership.objects.create(team=team, user=operator, role=Role.OPERATOR)
    client = APIClient()
    client.force_authenticate(admin)
    url = f"{TEAMS_URL}{team.name}/"
    # A team without a budget: every budget field null (the schema says so too).
    assert client.get(url).json() == {"team": team.name, "budget_tokens": None,
                                      "budget_period": None, "budget_spent": None,
                                      "budget_renews_at": None}

    bad = client.put(url, {"budget_tokens": 0}, format="json")
    assert bad.status_code == 400 and list(bad.json()) == ["budget_tokens"]
    bad = client.put(url, {"budget_tokens": 9, "budget_period": "year"}, format="json")
    assert bad.status_code == 400 and list(bad.json()) == ["budget_period"]
    bad = client.put(url, {"budget_tokens": 9, "budget_period": None}, format="json")
    assert bad.status_code == 400 and list(bad.json()) == ["budget_period"]
    bad = client.patch(url, {"budget_period": "day"}, format="json")
    assert bad.status_code == 400 and list(bad.json()) == ["budget_tokens"]

    assert client.put(url, {"budget_tokens": 10_000, "budget_period": "day"},
                      format="json").status_code == 200
    key = ApiKey.objects.create(name="k", team=team, prefix="0123abcd", key_hash="0" * 64,
                                all_deployments=True)
    usage(deployment, key, TODAY, 70, 30)
    answer = client.get(url).json()
    assert answer["budget_tokens"] == 10_000 and answer["budget_spent"] == 100
    assert answer["budget_period"] == "day"
    assert [row["team"] for row in client.get(TEAMS_URL).json()["results"]] == [team.name]

    as_operator = APIClient()
    as_operator.force_authenticate(operator)
    assert as_operator.patch(url, {"budget_tokens": 1}, format="json").status_code == 403

    assert client.delete(url).status_code == 204
    assert not TeamBudget.objects.exists()
    assert client.delete(url).status_code == 404
    assert [e.action for e in AuditEntry.objects.order_by("pk")] == [
        "team_budget.edit", "team_budget.delete"]


# ---- the spend and the key set -------------------------------------------------------------------

def test_the_spend_counts_the_period_per_deployment(db: None, deployment: Deployment) -> None:
    team = deployment.team
    daily = ApiKey.objects.create(name="d", team=team, prefix="dddddddd", key_hash="d" * 64,
                                  all_deployments=True, budget_tokens=10, budget_period="day")
    monthly = ApiKey.objects.create(name="m", team=team, prefix="mmmmmmmm", key_hash="m" * 64,
                                    all_deployments=True, budget_tokens=10)
    team_budget = TeamBudget.objects.create(team=team, tokens=100, period="month")
    now = datetime(2026, 12, 15, 12, tzinfo=UTC)
    for key in (daily, monthly):
        usage(deployment, key, date(2026, 12, 15), 10, 1)
        usage(deployment, key, date(2026, 12, 15), 20, 2, name="elsewhere")
        usage(deployment, key, date(2026, 12, 14), 100, 0)        # earlier this month
        usage(deployment, key, date(2026, 11, 30), 1000, 0)       # last month
    spent = spend([daily, monthly], [team_budget], now=now)
    assert spent.keys[daily.pk] == {deployment.name: 11, "elsewhere": 22}
    assert spent.key(monthly.pk) == 133
    assert spent.team(team.pk) == 133 + 133  # the month, both keys


def test_the_key_set_carries_model_limits_and_budgets_with_their_spend(
        api: APIClient, deployment: Deployment, django_capture_on_commit_callbacks: OnCommit) -> None:
    served = deployment.served_model_name
    with django_capture_on_commit_callbacks(execute=True):
        made = create(api, model_limits={served: {"requests_per_minute": 5}},
                      budget_tokens=1000).json()
        api.put(f"{TEAMS_URL}{deployment.team.name}/", {"budget_tokens": 5000}, format="json")
    key = ApiKey.objects.get(pk=made["id"])
    usage(deployment, key, TODAY, 100, 20)
    usage(deployment, key, TODAY, 7, 0, name="elsewhere")

    body = key_set(deployment)
    [entry] = [e for e in body["keys"] if e["id"] == key.pk]
    _day, month = periods(NOW.timestamp())
    assert entry["model_limits"] == {served: {"requests_per_minute": 5}}
    assert entry["team"] == deployment.team_id
    assert entry["budget"] == {"tokens": 1000, "period": "month", "period_start": month.start,
                               "spent": 127, "spent_here": 120}
    assert body["teams"] == {str(deployment.team_id): {
        "tokens": 5000, "period": "month", "period_start": month.start, "spent": 127,
        "spent_here": 120}}
    # What the router makes of it: the model's limit on its model only.
    parsed = parse_key_set(body, model=served)
    router_key = parsed.by_prefix[key.prefix]
    assert router_key.limits.requests_per_minute == 5 and router_key.model_scoped[0]
    assert router_key.budget is not None and router_key.budget.spent == 127
    assert router_key.team_budget is not None and router_key.team_budget.tokens == 5000
    assert not parse_key_set(body, model="other").by_prefix[key.prefix].model_scoped[0]
    # The file a router starts with was written as the change committed (the spend came later).
    written = json.loads(keys_file_path(deployment).read_text())
    assert [e for e in written["keys"] if e["id"] == key.pk][0]["budget"]["tokens"] == 1000

    # A revoked key's budget is not pushed: the router refuses it anyway.
    with django_capture_on_commit_callbacks(execute=True):
        api.post(f"{URL}{key.pk}/revoke")
    [entry] = [e for e in key_set(deployment)["keys"] if e["id"] == key.pk]
    assert "budget" not in entry


# ---- the key sync pushes the new spend -----------------------------------------------------------

class PushedStub(AdminStub):
    def __init__(self, port: int, version: str) -> None:
        self.pushed: list[dict[str, Any]] = []
        super().__init__(port, version)
        self.RequestHandlerClass = _PushHandler


class _PushHandler(_AdminHandler):
    server: PushedStub

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        self.server.pushed.append(json.loads(self.rfile.read(length)))
        self.send_json(200, {"version": self.server.pushed[-1]["version"]})


@dataclass
class Running:
    deployment: Deployment
    stub: PushedStub
    key: ApiKey


@pytest.fixture
def running(db: None, tmp_path: Path) -> Iterator[Running]:
    team = Team.objects.create(name="apps")
    deployment = make_plan(tmp_path, name="metered", team=team,
                           desired_state=Deployment.DesiredState.RUNNING)
    ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                  port=deployment.router_port, pid=os.getpid(),
                                  state=ManagedProcess.State.READY,
                                  log_path=str(tmp_path / "router.log"))
    key = ApiKey.objects.create(name="batch", team=team, prefix="0123abcd", key_hash="0" * 64,
                                all_deployments=True, budget_tokens=500, budget_period="day")
    stub = PushedStub(deployment.router_port, key_set(deployment)["version"])
    threading.Thread(target=stub.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield Running(deployment, stub, key)
    finally:
        stub.shutdown()
        stub.server_close()


def test_a_ledger_read_that_changes_the_spend_is_pushed_in_the_same_round(
        running: Running) -> None:
    stub, key = running.stub, running.key
    assert KeySync().sync_once() == 1
    assert stub.pushed == []  # the router's set is the console's: nothing to push
    stub.answer([ledger_row(TODAY, str(key.pk), 3, 0, 300, 50),
                 ledger_row(TODAY - timedelta(days=1), str(key.pk), 1, 0, 999, 0)])
    assert KeySync().sync_once() == 1
    [pushed] = stub.pushed
    [entry] = [e for e in pushed["keys"] if e["id"] == key.pk]
    # A daily budget: yesterday's tokens are not today's spend.
    assert entry["budget"]["spent"] == 350 and entry["budget"]["spent_here"] == 350
    assert entry["budget"]["period_start"] == TODAY.isoformat()
