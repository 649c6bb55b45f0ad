"""Usage metering in the console: the router is started with a ledger file under the data
directory; the key sync stores the ledger as ``UsageDay`` rows, replacing (never adding) the
router's cumulative totals and keeping them while a router does not answer; the REST API
(filters, grouping, team scoping, 400s naming the parameter), the CSV export, the page and the
console's /metrics. Against a stub admin API on a real socket, and a real router process with
stand-in workers that is restarted on its ledger file."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from console.accounts.models import Membership, Role, Team
from console.audit.models import AuditEntry
from console.control.k8s_manifests import layouts, router_process
from console.control.k8s_objects import Target
from console.control.worker_specs import process_specs
from console.deployments.models import Deployment, WorkerPlan
from console.gateway.models import ApiKey, UsageDay
from console.gateway.router_admin import (
    CONSOLE_KEY_PREFIX,
    AdminUnreadable,
    console_key,
    fetch_usage_ledger,
)
from console.gateway.services import key_set
from console.gateway.sync import KeySync
from console.gateway.usage import usage_file_path
from console.supervisor.models import ManagedProcess
from inference.router.keys import CONSOLE_KEY_ID
from tests.console.sockets import listening, wait_for
from tests.console.tiny_models import make_plan, make_startable
from tests.console.tokens import token_for
from tests.json_handler import JsonHandler

pytestmark = pytest.mark.django_db

URL = "/api/v1/usage/"
EXPORT = "/api/v1/usage/export.csv"
OnCommit = Callable[..., Any]
TODAY = datetime.now(UTC).date()
YESTERDAY = TODAY - timedelta(days=1)


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return Path(settings.DATA_DIR)


def ledger_row(day: date, key: str, requests: int, errors: int = 0, prompt: int = 0,
               completion: int = 0, latency: float = 0.0) -> dict[str, Any]:
    """A row of ``GET /admin/usage`` as the router writes it."""
    return {"day": day.isoformat(), "key": key, "requests": requests, "errors": errors,
            "prompt_tokens": prompt, "completion_tokens": completion, "latency_ms_sum": latency}


def stored() -> list[tuple[Any, ...]]:
    return list(UsageDay.objects.order_by("day", "deployment_name", "router_key").values_list(
        "day", "deployment_name", "router_key", "key_id", "key_prefix", "team_id", "model",
        "requests", "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum"))


# ---- the router's argv ------------------------------------------------------------------------

def test_the_router_is_started_with_its_ledger_under_the_data_dir(
        deployment: Deployment, data_dir: Path) -> None:
    router = next(spec for spec in process_specs(deployment) if spec.slot == "router")
    flag = router.argv.index("--usage-file")
    assert router.argv[flag + 1] == str(data_dir / "usage" / f"{deployment.name}.sqlite3")
    assert usage_file_path(deployment) == data_dir / "usage" / f"{deployment.name}.sqlite3"
    assert router.argv.count("--usage-file") == 1
    # An exported router (Kubernetes) has no volume for a ledger: it meters in memory.
    target = Target(namespace="serving")
    exported, _env = router_process(deployment, layouts(deployment, target), target)
    assert "--keys-file" in exported and "--usage-file" not in exported


def test_a_name_that_is_no_file_name_gets_no_ledger_path(deployment: Deployment) -> None:
    for name in ("../elsewhere", ".hidden", "a/b", ""):
        deployment.name = name
        with pytest.raises(ValueError, match="not a deployment name"):
            usage_file_path(deployment)


# ---- ingestion, against a stub admin API ------------------------------------------------------

class AdminStub(ThreadingHTTPServer):
    """A router's admin API: key usage at the console's key set version (nothing to push), and
    ``ledger`` (status, body) for ``/admin/usage``; the paths asked are kept."""

    def __init__(self, port: int, version: str) -> None:
        self.version = version
        self.ledger: tuple[int, bytes] = (200, b'{"version": 1, "rows": []}')
        self.asked: list[str] = []
        super().__init__(("127.0.0.1", port), _AdminHandler)

    def answer(self, rows: list[dict[str, Any]] | None = None, status: int = 200,
               body: bytes | None = None) -> None:
        self.ledger = (status, body if body is not None
                       else json.dumps({"version": 1, "rows": rows or []}).encode())


class _AdminHandler(JsonHandler):
    server: AdminStub

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.asked.append(self.path)
        if self.path.startswith("/admin/usage"):
            status, body = self.server.ledger
        else:
            status, body = 200, json.dumps({"version": self.server.version, "keys": {}}).encode()
        self.send_bytes(status, body)


@dataclass
class Stubbed:
    deployment: Deployment
    stub: AdminStub
    key: ApiKey
    team: Team


@pytest.fixture
def stubbed(tmp_path: Path) -> Iterator[Stubbed]:
    """A running plan of team ``ops`` whose router is the stub, and a key of team ``apps``."""
    ops, apps = Team.objects.create(name="ops"), Team.objects.create(name="apps")
    deployment = make_plan(tmp_path, name="metered", team=ops,
                           desired_state=Deployment.DesiredState.RUNNING)
    ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                  port=deployment.router_port, pid=os.getpid(),
                                  state=ManagedProcess.State.READY,
                                  log_path=str(tmp_path / "router.log"))
    key = ApiKey.objects.create(name="batch", team=apps, prefix="0123abcd", key_hash="0" * 64,
                                all_deployments=True)
    stub = AdminStub(deployment.router_port, key_set(deployment)["version"])
    threading.Thread(target=stub.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield Stubbed(deployment, stub, key, ops)
    finally:
        stub.shutdown()
        stub.server_close()


def test_a_sync_stores_the_ledger_and_a_later_one_replaces_its_totals(stubbed: Stubbed) -> None:
    deployment, stub, key = stubbed.deployment, stubbed.stub, stubbed.key
    stub.answer([ledger_row(YESTERDAY, str(key.pk), 5, 1, 500, 100, 250.0),
                 ledger_row(TODAY, str(key.pk), 2, 0, 40, 8, 20.0),
                 ledger_row(TODAY, "", 1, 0, 7, 3, 5.5),
                 ledger_row(TODAY, CONSOLE_KEY_ID, 1, 0, 9, 2, 4.0),
                 ledger_row(TODAY, "987654", 1, 1, 0, 0, 1.0)])
    assert KeySync().sync_once() == 1
    ops, apps = stubbed.team.pk, key.team_id
    assert stored() == [
        (YESTERDAY, "metered", str(key.pk), key.pk, "0123abcd", apps, "tiny", 5, 1, 500, 100, 250.0),
        (TODAY, "metered", "", None, "", ops, "tiny", 1, 0, 7, 3, 5.5),
        (TODAY, "metered", str(key.pk), key.pk, "0123abcd", apps, "tiny", 2, 0, 40, 8, 20.0),
        # An id the console has no key for: no key, no prefix, the deployment's team.
        (TODAY, "metered", "987654", None, "", ops, "tiny", 1, 1, 0, 0, 1.0),
        (TODAY, "metered", CONSOLE_KEY_ID, None, CONSOLE_KEY_PREFIX, ops, "tiny", 1, 0, 9, 2, 4.0),
    ]
    # Nothing was stored before: the whole ledger was asked for.
    assert stub.asked[-1] == "/admin/usage"

    # The router's totals grew: the stored rows become them, not their sum with the old ones.
    stub.answer([ledger_row(YESTERDAY, str(key.pk), 6, 1, 600, 120, 300.0),
                 ledger_row(TODAY, str(key.pk), 4, 1, 80, 16, 44.0)])
    updated = UsageDay.objects.get(day=YESTERDAY).updated
    assert KeySync().sync_once() == 1
    assert stub.asked[-1] == f"/admin/usage?since={YESTERDAY.isoformat()}"
    rows = {(r[0], r[2]): r[7:] for r in stored()}
    assert rows[(YESTERDAY, str(key.pk))] == (6, 1, 600, 120, 300.0)
    assert rows[(TODAY, str(key.pk))] == (4, 1, 80, 16, 44.0)
    assert rows[(TODAY, "")] == (1, 0, 7, 3, 5.5)  # not in this answer: kept
    assert UsageDay.objects.count() == 5
    assert set(UsageDay.objects.values_list("deployment", flat=True)) == {deployment.pk}
    assert UsageDay.objects.get(day=YESTERDAY).updated > updated

    # The same totals again: nothing is written (``updated`` says when a row last changed).
    before = list(UsageDay.objects.values_list("updated", flat=True).order_by("pk"))
    assert KeySync().sync_once() == 1
    assert list(UsageDay.objects.values_list("updated", flat=True).order_by("pk")) == before


def test_days_not_read_for_a_while_are_asked_for_again(stubbed: Stubbed) -> None:
    """A router unread for days (the console down): the ledger is read from the last day
    stored, not only from yesterday, so those days' last counts are not lost."""
    week_ago = TODAY - timedelta(days=7)
    UsageDay.objects.create(day=week_ago, deployment=stubbed.deployment, deployment_name="metered",
                            router_key="", team=stubbed.team, model="tiny", requests=1)
    stubbed.stub.answer([ledger_row(week_ago, "", 3)])
    assert KeySync().sync_once() == 1
    assert stubbed.stub.asked[-1] == f"/admin/usage?since={week_ago.isoformat()}"
    assert UsageDay.objects.get(day=week_ago).requests == 3


@pytest.mark.parametrize("status, body", [
    (503, b'{"error": {"message": "usage ledger unreadable", "code": "usage_unavailable"}}'),
    (404, b'{"error": {"message": "Not Found"}}'),
    (200, b"<html>a proxy's page</html>"),
    (200, b'{"version": 2, "rows": []}'),
    (200, b'{"version": 1, "rows": [{"day": "2026-12-04", "key": ""}]}'),
])
def test_a_ledger_that_cannot_be_read_keeps_the_stored_rows(
        stubbed: Stubbed, caplog: pytest.LogCaptureFixture, status: int, body: bytes) -> None:
    key = str(stubbed.key.pk)
    stubbed.stub.answer([ledger_row(TODAY, key, 2, 0, 40, 8, 20.0)])
    assert KeySync().sync_once() == 1
    before = stored()

    stubbed.stub.answer(status=status, body=body)
    with caplog.at_level(logging.WARNING, "pdserve.gateway"):
        KeySync().sync_once()
    assert "usage ledger of metered unreadable" in caplog.text
    assert "stored usage kept, asking again next round" in caplog.text
    assert stored() == before  # unknown is not "no use": nothing reset or removed

    stubbed.stub.answer([ledger_row(TODAY, key, 3, 0, 60, 12, 30.0)])
    KeySync().sync_once()  # read again once it answers
    assert [row[7:] for row in stored()] == [(3, 0, 60, 12, 30.0)]


@pytest.mark.parametrize("row", [
    {"requests": -1}, {"requests": True}, {"prompt_tokens": 1.5}, {"latency_ms_sum": -2.0},
    {"latency_ms_sum": "5"}, {"day": "2026-02-30"}, {"day": 20261204}, {"key": 3},
])
def test_a_malformed_ledger_row_is_unreadable(stubbed: Stubbed, row: dict[str, Any]) -> None:
    stubbed.stub.answer([{**ledger_row(TODAY, "", 1), **row}])
    with pytest.raises(AdminUnreadable, match="not a usage ledger row"):
        fetch_usage_ledger(stubbed.deployment)


# ---- API, CSV, page, metrics: two teams' stored usage ----------------------------------------

@dataclass
class Usage:
    alpha: Team
    bravo: Team
    alpha_dep: Deployment
    bravo_dep: Deployment
    alpha_key: ApiKey
    bravo_key: ApiKey
    member: User   # a viewer of alpha
    stranger: User  # an admin of bravo


def _member(name: str, team: Team, role: Role) -> User:
    user = User.objects.create_user(name, "", "pw")
    Membership.objects.create(team=team, user=user, role=role)
    return user


def _row(deployment: Deployment, day: date, key: ApiKey | None, requests: int, errors: int,
         prompt: int, completion: int, latency: float, model: str | None = None) -> UsageDay:
    return UsageDay.objects.create(
        day=day, deployment=deployment, deployment_name=deployment.name, key=key,
        router_key=str(key.pk) if key else "", key_prefix=key.prefix if key else "",
        team=key.team if key else deployment.team, model=model or deployment.served_model_name,
        requests=requests, errors=errors, prompt_tokens=prompt, completion_tokens=completion,
        latency_ms_sum=latency)


D1, D2, D3 = date(2025, 11, 30), date(2025, 12, 1), date(2025, 12, 2)


@pytest.fixture
def usage(tmp_path: Path) -> Usage:
    alpha, bravo = Team.objects.create(name="alpha"), Team.objects.create(name="bravo")
    alpha_dep = make_plan(tmp_path, name="alpha-dep", team=alpha, served_model_name="alpha-chat")
    bravo_dep = make_plan(tmp_path, name="bravo-dep", team=bravo, served_model_name="bravo-chat")
    alpha_key = ApiKey.objects.create(name="alpha-key", team=alpha, prefix="aaaa0001",
                                      key_hash="a" * 64, all_deployments=True)
    bravo_key = ApiKey.objects.create(name="bravo-key", team=bravo, prefix="bbbb0001",
                                      key_hash="b" * 64, all_deployments=True)
    _row(alpha_dep, D1, alpha_key, 10, 1, 1000, 200, 500.0)
    _row(alpha_dep, D2, alpha_key, 20, 0, 2000, 400, 1500.0)
    _row(alpha_dep, D2, None, 4, 2, 40, 8, 100.0)
    _row(alpha_dep, D3, alpha_key, 5, 0, 500, 100, 250.0, model="alpha-old")
    _row(bravo_dep, D2, bravo_key, 7, 0, 700, 70, 70.0)
    return Usage(alpha, bravo, alpha_dep, bravo_dep, alpha_key, bravo_key,
                 member=_member("vera", alpha, Role.VIEWER),
                 stranger=_member("stan", bravo, Role.ADMIN))


def as_user(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def results(client: APIClient, **query: Any) -> list[dict[str, Any]]:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def counts(row: dict[str, Any]) -> tuple[int, int, int, int, float | None]:
    return (row["requests"], row["errors"], row["prompt_tokens"], row["completion_tokens"],
            row["latency_ms_avg"])


def test_usage_per_day_is_the_default_grouping(api: APIClient, usage: Usage) -> None:
    rows = results(api)
    assert [(r["day"], *counts(r)) for r in rows] == [
        ("2025-11-30", 10, 1, 1000, 200, 50.0),
        ("2025-12-01", 31, 2, 2740, 478, 53.871),
        ("2025-12-02", 5, 0, 500, 100, 50.0),
    ]
    assert set(rows[0]) == {"day", "requests", "errors", "prompt_tokens", "completion_tokens",
                            "latency_ms_avg"}


def test_grouping_by_key_team_model_and_deployment(api: APIClient, usage: Usage) -> None:
    by_key = results(api, group_by="key")
    assert [(r["key"], r["key_prefix"], r["key_name"], r["requests"]) for r in by_key] == [
        (None, "", None, 4), (usage.alpha_key.pk, "aaaa0001", "alpha-key", 35),
        (usage.bravo_key.pk, "bbbb0001", "bravo-key", 7)]
    by_team = results(api, group_by="team")
    assert [(r["team"], r["team_name"], r["prompt_tokens"]) for r in by_team] == [
        (usage.alpha.pk, "alpha", 3540), (usage.bravo.pk, "bravo", 700)]
    by_model = results(api, group_by="model")
    assert [(r["model"], r["requests"]) for r in by_model] == [
        ("alpha-chat", 34), ("alpha-old", 5), ("bravo-chat", 7)]
    by_deployment = results(api, group_by="deployment")
    assert [(r["deployment"], r["deployment_name"], r["requests"]) for r in by_deployment] == [
        (usage.alpha_dep.pk, "alpha-dep", 39), (usage.bravo_dep.pk, "bravo-dep", 7)]
    both = results(api, group_by="key,model")
    assert [(r["key_prefix"], r["model"], r["requests"]) for r in both] == [
        ("", "alpha-chat", 4), ("aaaa0001", "alpha-chat", 30), ("aaaa0001", "alpha-old", 5),
        ("bbbb0001", "bravo-chat", 7)]


def test_filters_narrow_the_rows(api: APIClient, usage: Usage) -> None:
    def requests(**query: Any) -> int:
        return sum(r["requests"] for r in results(api, group_by="team", **query))

    assert requests() == 46
    assert requests(team=usage.bravo.pk) == 7
    assert requests(key=usage.alpha_key.pk) == 35
    assert requests(deployment=usage.alpha_dep.pk) == 39
    assert requests(model="alpha-old") == 5
    assert requests(since="2025-12-01") == 36
    assert requests(until="2025-12-01") == 41
    assert requests(since="2025-12-01", until="2025-12-01") == 31
    assert requests(team=usage.alpha.pk, model="bravo-chat") == 0
    assert requests(key=123456789) == 0


def test_a_member_sees_only_their_teams_usage(usage: Usage) -> None:
    member, stranger = as_user(usage.member), as_user(usage.stranger)
    assert [r["team_name"] for r in results(member, group_by="team")] == ["alpha"]
    assert [r["team_name"] for r in results(stranger, group_by="team")] == ["bravo"]
    # Another team's id is no error: it matches nothing the reader may see.
    assert results(stranger, team=usage.alpha.pk) == []
    assert results(stranger, key=usage.alpha_key.pk) == []
    assert results(stranger, deployment=usage.alpha_dep.pk) == []
    assert "alpha" not in stranger.get(EXPORT, {"team": usage.alpha.pk}).getvalue().decode()


@pytest.mark.parametrize("query, field", [
    ({"since": "2026-13-01"}, "since"), ({"since": "yesterday"}, "since"),
    ({"until": "2026-12-1x"}, "until"), ({"since": "2025-12-02", "until": "2025-12-01"}, "until"),
    ({"group_by": "week"}, "group_by"), ({"group_by": "day,day"}, "group_by"),
    ({"team": "alpha"}, "team"), ({"team": "0"}, "team"), ({"team": "²"}, "team"),
    ({"key": "123456789012345678901234"}, "key"), ({"deployment": "-1"}, "deployment"),
    ({"model": "m" * 101}, "model"),
])
def test_a_bad_parameter_is_400_naming_it_and_changes_nothing(
        api: APIClient, usage: Usage, query: dict[str, str], field: str) -> None:
    before, entries = stored(), AuditEntry.objects.count()
    paths = [URL, EXPORT] if field != "group_by" else [URL]
    for path in paths:
        response = api.get(path, query)
        assert response.status_code == 400, (path, response.content)
        assert list(response.json()) == [field], (path, response.json())
    assert stored() == before and AuditEntry.objects.count() == entries


def test_reads_write_no_audit_entry(api: APIClient, usage: Usage) -> None:
    entries = AuditEntry.objects.count()
    for path in (URL, EXPORT):
        assert api.get(path).status_code == 200
    assert AuditEntry.objects.count() == entries


def read_csv(response: Any) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="pdserve-usage.csv"'
    return list(csv.reader(io.StringIO(response.getvalue().decode())))


def test_the_csv_has_a_header_and_one_line_per_stored_row(api: APIClient, usage: Usage) -> None:
    lines = read_csv(api.get(EXPORT))
    assert lines[0] == ["day", "team", "key_prefix", "key_name", "deployment", "model",
                        "requests", "errors", "prompt_tokens", "completion_tokens",
                        "latency_ms_sum"]
    assert lines[1:] == [
        ["2025-11-30", "alpha", "aaaa0001", "alpha-key", "alpha-dep", "alpha-chat", "10", "1",
         "1000", "200", "500.0"],
        ["2025-12-01", "alpha", "", "", "alpha-dep", "alpha-chat", "4", "2", "40", "8", "100.0"],
        ["2025-12-01", "alpha", "aaaa0001", "alpha-key", "alpha-dep", "alpha-chat", "20", "0",
         "2000", "400", "1500.0"],
        ["2025-12-01", "bravo", "bbbb0001", "bravo-key", "bravo-dep", "bravo-chat", "7", "0",
         "700", "70", "70.0"],
        ["2025-12-02", "alpha", "aaaa0001", "alpha-key", "alpha-dep", "alpha-old", "5", "0", "500",
         "100", "250.0"],
    ]
    # The same filters as the list.
    filtered = read_csv(api.get(EXPORT, {"team": usage.alpha.pk, "since": "2025-12-01",
                                         "model": "alpha-chat"}))
    assert [line[2] for line in filtered[1:]] == ["", "aaaa0001"]
    assert read_csv(as_user(usage.member).get(EXPORT))[1:] == [
        line for line in lines[1:] if line[1] == "alpha"]


def test_a_key_name_that_reads_as_a_formula_is_quoted(api: APIClient, usage: Usage) -> None:
    ApiKey.objects.filter(pk=usage.alpha_key.pk).update(name="=HYPERLINK(1)")
    lines = read_csv(api.get(EXPORT, {"key": usage.alpha_key.pk}))
    assert {line[3] for line in lines[1:]} == {"'=HYPERLINK(1)"}


def page(user: User, **query: Any) -> Any:
    client = Client()
    client.force_login(user)
    return client.get("/usage/", query)


def test_the_page_shows_a_member_their_usage_with_chart_table_and_csv_link(usage: Usage) -> None:
    response = page(usage.member, since="2025-11-01", model="alpha-chat")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'href="/usage/"' in text  # the nav link
    assert 'id="usage-chart"' in text and "vendor/uplot/uPlot.iife.min.js" in text
    assert "gateway/usage.js" in text and 'data-api="/api/v1/usage"' in text
    assert 'href="/api/v1/usage/export.csv?model=alpha-chat&amp;since=2025-11-01"' in text
    table = [row for row in response.context["rows"]]
    assert [(r["team_name"], r["key_prefix"], r["model"], r["requests"]) for r in table] == [
        ("alpha", "", "alpha-chat", 4), ("alpha", "aaaa0001", "alpha-chat", 30)]
    assert "alpha-key" in text and "no key" in text and "bravo" not in text


def test_the_page_opens_on_the_last_30_days(usage: Usage) -> None:
    _row(usage.alpha_dep, TODAY, usage.alpha_key, 1, 0, 11, 22, 3.0)
    response = page(usage.member)
    assert [r["requests"] for r in response.context["rows"]] == [1]
    since = (TODAY - timedelta(days=29)).isoformat()
    assert f"export.csv?since={since}" in response.content.decode()


def test_the_page_refuses_an_outsider_and_shows_another_team_nothing(
        usage: Usage, outsider: User) -> None:
    refused = page(outsider)  # a deactivated account: no session
    assert refused.status_code == 302 and refused["Location"].startswith("/login/")
    anonymous = Client().get("/usage/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    response = page(usage.stranger, since="2025-11-01", team=usage.alpha.pk)
    assert response.status_code == 200
    assert response.context["rows"] == []
    text = response.content.decode()
    assert not [name for name in ("alpha-dep", "alpha-key", "alpha-chat", "alpha") if name in text]


def test_a_bad_filter_on_the_page_is_400_naming_it(usage: Usage) -> None:
    response = page(usage.member, since="2025-12-02", until="2025-12-01")
    assert response.status_code == 400
    assert response.context["form"].errors == {"until": ["must not be before since"]}


def metric_samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode())
            if family.name.startswith("pdserve_usage_") for s in family.samples}


def test_the_console_metrics_export_usage_per_team_key_and_model(usage: Usage,
                                                                 owner: User) -> None:
    everything = metric_samples(Client(headers={
        "Authorization": f"Bearer {token_for(owner, 'prometheus')}"}))
    def sample(name: str, **labels: str) -> float:
        key = {"team": "alpha", "key": "pds_aaaa0001", "model": "alpha-chat", **labels}
        return everything[(name, tuple(sorted(key.items())))]

    assert sample("pdserve_usage_tokens_total", kind="prompt") == 3000
    assert sample("pdserve_usage_tokens_total", kind="completion") == 600
    assert sample("pdserve_usage_requests_total", outcome="ok") == 29
    assert sample("pdserve_usage_requests_total", outcome="error") == 1
    assert sample("pdserve_usage_requests_total", key="", outcome="error") == 2
    # A team's reader gets its own teams' usage only.
    theirs = metric_samples(Client(headers={
        "Authorization": f"Bearer {token_for(usage.stranger, 'prometheus')}"}))
    assert theirs and {dict(labels)["team"] for _name, labels in theirs} == {"bravo"}


# ---- a real router, restarted on its ledger ------------------------------------------------------

FAIL = 99  # the max_tokens the stand-in refuses


class Worker(ThreadingHTTPServer):
    """Stands in for a vLLM worker: healthy; answers a completion with ``max_tokens`` tokens and
    vLLM's ``usage``, or a 400 for ``max_tokens`` FAIL. Prompts are made of "a" and "b", each a
    token of the tiny model's tokenizer: its usage agrees with the router's own count."""

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _WorkerHandler)


class _WorkerHandler(JsonHandler):

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_json(200, {})

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt, wanted = request["prompt"], request["max_tokens"]
        if wanted == FAIL:
            self.send_json(400, {"error": {"message": "refused", "type": "BadRequestError",
                                       "param": "prompt", "code": 400}})
            return
        prompt_tokens = len(prompt)
        self.send_json(200, {"id": "cmpl-x", "object": "text_completion", "model": request["model"],
                         "choices": [{"index": 0, "text": " x" * wanted,
                                      "finish_reason": "length"}],
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": wanted,
                                   "total_tokens": prompt_tokens + wanted}})


@dataclass
class Counted:
    """What the client saw, per key id as the router files it."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class RealRouter:
    """The deployment's router as the supervisor starts it (its own argv: the key file and the
    ledger under the data directory), with its process row; started again on the same files."""

    def __init__(self, deployment: Deployment, log: Path) -> None:
        self.deployment = deployment
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        spec = next(s for s in process_specs(self.deployment) if s.slot == "router")
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(spec.argv, env={**os.environ, **spec.env},
                                            stdout=out, stderr=subprocess.STDOUT)
        process = self.process
        wait_for(lambda: listening(self.deployment.router_port) or process.poll() is not None,
                 "the router to listen", timeout=60)
        assert process.poll() is None, self.log.read_text()
        ManagedProcess.objects.update_or_create(
            deployment=self.deployment, slot="router",
            defaults={"role": "router", "port": self.deployment.router_port, "pid": process.pid,
                      "state": ManagedProcess.State.READY, "log_path": str(self.log)})

    def stop(self) -> None:
        """SIGTERM, as the supervisor stops it: the router writes what it holds and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        ManagedProcess.objects.filter(deployment=self.deployment, slot="router").update(
            pid=None, state=ManagedProcess.State.STOPPED)


@pytest.fixture
def colocated(tmp_path: Path) -> Iterator[Deployment]:
    """A running plan of one colocated worker (the stand-in, on the plan's port)."""
    deployment = make_plan(tmp_path, name="metered", mode=Deployment.Mode.COLOCATED,
                           desired_state=Deployment.DesiredState.RUNNING)
    first, second = deployment.workers.order_by("pk")
    second.delete()
    WorkerPlan.objects.filter(pk=first.pk).update(role=WorkerPlan.Role.COLOCATED, index=0)
    deployment = make_startable(deployment)
    worker = Worker(deployment.workers.get().port)
    threading.Thread(target=worker.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield deployment
    finally:
        worker.shutdown()
        worker.server_close()


def send(deployment: Deployment, secret: str, prompt: str, max_tokens: int,
         seen: dict[str, Counted], key_id: str) -> None:
    response = httpx.post(f"{deployment.router_url}/v1/completions", timeout=30,
                          headers={"Authorization": f"Bearer {secret}"},
                          json={"model": deployment.served_model_name, "prompt": prompt,
                                "max_tokens": max_tokens})
    counted = seen.setdefault(key_id, Counted())
    counted.requests += 1
    if response.status_code >= 400:
        counted.errors += 1
        return
    assert response.status_code == 200, response.text
    counted.prompt_tokens += response.json()["usage"]["prompt_tokens"]
    counted.completion_tokens += response.json()["usage"]["completion_tokens"]


def totals() -> dict[str, Counted]:
    out: dict[str, Counted] = {}
    for row in UsageDay.objects.all():  # summed over days: a run may cross midnight (UTC)
        counted = out.setdefault(row.router_key, Counted())
        counted.requests += row.requests
        counted.errors += row.errors
        counted.prompt_tokens += row.prompt_tokens
        counted.completion_tokens += row.completion_tokens
    return out


def test_a_real_routers_usage_is_stored_and_outlives_its_restart(
        api: APIClient, colocated: Deployment, data_dir: Path,
        django_capture_on_commit_callbacks: OnCommit) -> None:
    deployment = colocated
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/keys/", {"name": "batch", "all_deployments": True},
                            format="json")
    assert response.status_code == 201, response.content
    key_id, secret = str(response.json()["id"]), response.json()["key"]
    router = RealRouter(deployment, data_dir / "router.log")
    seen: dict[str, Counted] = {}
    router.start()
    try:
        for index in range(4):
            send(deployment, secret, "ab" * (index + 1), 3 + index, seen, key_id)
        send(deployment, secret, "abba", FAIL, seen, key_id)
        send(deployment, console_key(deployment), "aab", 2, seen, CONSOLE_KEY_ID)
        assert KeySync().sync_once() == 1
        assert totals() == seen
        key_rows = UsageDay.objects.filter(router_key=key_id)
        assert {(r.key_id, r.key_prefix, r.model, r.deployment_id) for r in key_rows} == {
            (int(key_id), ApiKey.objects.get(pk=key_id).prefix, "tiny", deployment.pk)}
        assert usage_file_path(deployment).is_file()

        router.stop()
        router.start()  # on the same ledger file
        for index in range(3):
            send(deployment, secret, "bab" * (index + 2), 4, seen, key_id)
        send(deployment, secret, "ba", FAIL, seen, key_id)
        assert KeySync().sync_once() == 1
        assert totals() == seen  # both runs, each request once
        assert seen[key_id].requests == 9 and seen[key_id].errors == 2
        # Read again, nothing is added.
        assert KeySync().sync_once() == 1
        assert totals() == seen
        assert sorted((r["key_prefix"] == CONSOLE_KEY_PREFIX, r["requests"])
                      for r in results(api, group_by="key")) == [(False, 9), (True, 1)]
    finally:
        router.stop()
