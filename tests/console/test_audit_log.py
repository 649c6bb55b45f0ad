"""The audit log, read: the API's list, detail and export (JSON lines, CSV) with their filters,
who sees which entries, the page, and that nothing changes or deletes an entry -- not the API,
not the admin, not the ORM."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import ProtectedError
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.accounts.models import Membership, Role, Team
from console.audit.actors import acting_as
from console.audit.entries import record
from console.audit.models import AppendOnly, AuditEntry

pytestmark = pytest.mark.django_db

LIST = "/api/v1/audit/"
EXPORT = "/api/v1/audit/export/"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def entry(action: str, *, by: User | None = None, team: Team | None = None,
          minutes: int = 0, **fields: object) -> AuditEntry:
    values: dict[str, object] = {
        "actor": AuditEntry.Actor.USER, "user": by, "username": by.username if by else "",
        "address": "10.0.0.7", "action": action, "object_type": "deployments.deployment",
        "object_id": "1", "object_repr": "smollm2-1p1d", "team_id": team.pk if team else None,
        "at": T0 + timedelta(minutes=minutes), **fields}
    return AuditEntry.objects.create(**values)


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def ids(response: object) -> list[int]:
    assert response.status_code == 200, response.content  # type: ignore[attr-defined]
    return [row["id"] for row in response.json()["results"]]  # type: ignore[attr-defined]


@pytest.fixture
def teams(db: None) -> dict[str, Team]:
    return {name: Team.objects.create(name=name) for name in ("red", "blue")}


@pytest.fixture
def alice(teams: dict[str, Team]) -> User:
    """An operator of red."""
    user = User.objects.create_user("alice", password="alice-pass-123")
    Membership.objects.create(team=teams["red"], user=user, role=Role.OPERATOR)
    return user


@pytest.fixture
def carol(teams: dict[str, Team]) -> User:
    """A viewer of blue: red's entries are not hers to see."""
    user = User.objects.create_user("carol", password="carol-pass-123")
    Membership.objects.create(team=teams["blue"], user=user, role=Role.VIEWER)
    return user


@pytest.fixture
def log(owner: User, alice: User, carol: User, teams: dict[str, Team]) -> dict[str, AuditEntry]:
    """Entries of both teams, of no team, and one by carol about a red object."""
    return {
        "red_start": entry("deployment.start", by=alice, team=teams["red"], minutes=0),
        "red_edit": entry("deployment.edit", by=owner, team=teams["red"], minutes=10,
                          changes={"max_model_len": [2048, 4096]}),
        "blue_key": entry("key.create", by=carol, team=teams["blue"], minutes=20,
                          object_type="gateway.apikey", object_id="7", object_repr="ci"),
        "node": entry("node.edit", by=owner, minutes=30, object_type="fleet.node",
                      object_id="3", object_repr="gpu-1"),
        "carol_red": entry("deployment.stop", by=carol, team=teams["red"], minutes=40),
    }


# ---- filters -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("query", "expected"), [
    ("", ["carol_red", "node", "blue_key", "red_edit", "red_start"]),
    ("user=owner", ["node", "red_edit"]),
    ("user=nobody", []),
    ("object_type=gateway.apikey", ["blue_key"]),
    ("object_type=deployments.deployment&object_id=1", ["carol_red", "red_edit", "red_start"]),
    ("object_id=3", ["node"]),
    ("action=deployment.start", ["red_start"]),
    ("action=deployment.", ["carol_red", "red_edit", "red_start"]),
    # Without the trailing dot an action is exact: no prefix match on "deployment".
    ("action=deployment", []),
    ("since=2026-11-30T12:10:00Z", ["carol_red", "node", "blue_key", "red_edit"]),
    ("until=2026-11-30T12:20:00%2B00:00", ["red_edit", "red_start"]),
    ("since=2026-11-30T12:10:00Z&until=2026-11-30T12:30:00Z", ["blue_key", "red_edit"]),
    ("user=carol&action=deployment.", ["carol_red"]),
])
def test_the_list_filters_by_user_object_action_and_time(
        owner: User, log: dict[str, AuditEntry], query: str, expected: list[str]) -> None:
    assert ids(api(owner).get(f"{LIST}?{query}")) == [log[name].pk for name in expected]


@pytest.mark.parametrize(("query", "field"), [
    ("since=yesterday", "since"),
    ("until=2026-13-01T00:00:00", "until"),
    ("since=2026-11-30T13:00:00Z&until=2026-11-30T12:00:00Z", "until"),
    (f"user={'u' * 151}", "user"),
    ("action=a%00b", "action"),
])
def test_a_bad_filter_is_a_400_naming_it(owner: User, query: str, field: str) -> None:
    for url in (LIST, EXPORT):
        response = api(owner).get(f"{url}?{query}")
        assert response.status_code == 400, (url, response.content)
        assert response["Content-Type"] == "application/json"
        assert list(response.json()) == [field]
        assert all(isinstance(message, str) for message in response.json()[field])


def test_an_unknown_export_format_is_a_400_naming_format(owner: User) -> None:
    response = api(owner).get(f"{EXPORT}?format=xml")
    assert response.status_code == 400
    assert "format" in response.json()


# ---- exports -----------------------------------------------------------------------------------

def test_the_json_lines_export_is_the_filtered_list_one_object_a_line(
        owner: User, log: dict[str, AuditEntry]) -> None:
    listed = api(owner).get(f"{LIST}?action=deployment.").json()["results"]
    response = api(owner).get(f"{EXPORT}?action=deployment.&format=jsonl")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/jsonl")
    lines = response.content.decode().splitlines()
    assert [json.loads(line) for line in lines] == listed
    assert json.loads(lines[1])["changes"] == {"max_model_len": [2048, 4096]}
    assert response["X-Total-Count"] == "3"


def test_the_csv_export_has_a_header_and_a_row_per_entry(
        owner: User, log: dict[str, AuditEntry]) -> None:
    response = api(owner).get(f"{EXPORT}?format=csv&user=owner")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [int(row["id"]) for row in rows] == [log["node"].pk, log["red_edit"].pk]
    edit = rows[1]
    assert (edit["username"], edit["action"], edit["address"], edit["team_id"]) == (
        "owner", "deployment.edit", "10.0.0.7", str(log["red_edit"].team_id))
    assert json.loads(edit["changes"]) == {"max_model_len": [2048, 4096]}
    assert rows[0]["team_id"] == ""


def test_an_export_pages_as_the_list_does_and_links_the_next_page(
        owner: User, log: dict[str, AuditEntry]) -> None:
    client = api(owner)
    first = client.get(f"{EXPORT}?format=jsonl&limit=2")
    assert first["X-Total-Count"] == "5"
    assert 'rel="next"' in first["Link"] and 'rel="prev"' not in first["Link"]
    next_url = first["Link"].split(">")[0].lstrip("<")
    second = client.get(next_url)
    third = client.get(second["Link"].split(", ")[0].split(">")[0].lstrip("<"))
    seen = [json.loads(line)["id"] for page in (first, second, third)
            for line in page.content.decode().splitlines()]
    assert seen == ids(client.get(LIST))
    assert 'rel="next"' not in third["Link"]
    assert client.get(f"{EXPORT}?format=csv&limit=0").status_code == 400


def test_a_csv_cell_a_spreadsheet_would_run_is_quoted_as_text(owner: User) -> None:
    entry("key.create", by=owner, object_repr="=HYPERLINK(\"http://x\")")
    rows = list(csv.DictReader(io.StringIO(
        api(owner).get(f"{EXPORT}?format=csv").content.decode())))
    assert rows[0]["object_repr"] == "'=HYPERLINK(\"http://x\")"


# ---- who sees what -----------------------------------------------------------------------------

def test_members_see_their_teams_entries_and_their_own_a_superuser_all(
        owner: User, alice: User, carol: User, log: dict[str, AuditEntry]) -> None:
    assert set(ids(api(owner).get(LIST))) == {e.pk for e in log.values()}
    # alice (red): red's entries, carol's about red among them; not blue's nor the node's.
    assert ids(api(alice).get(LIST)) == [log[n].pk for n in ("carol_red", "red_edit", "red_start")]
    # carol (blue): blue's entry, and her own change of a red object.
    assert ids(api(carol).get(LIST)) == [log["carol_red"].pk, log["blue_key"].pk]
    exported = api(carol).get(f"{EXPORT}?format=jsonl").content.decode().splitlines()
    assert [json.loads(line)["id"] for line in exported] == ids(api(carol).get(LIST))


def test_an_entry_one_may_not_see_is_a_404(
        alice: User, carol: User, log: dict[str, AuditEntry]) -> None:
    assert api(alice).get(f"{LIST}{log['red_edit'].pk}/").json()["action"] == "deployment.edit"
    assert api(carol).get(f"{LIST}{log['red_edit'].pk}/").status_code == 404
    assert api(alice).get(f"{LIST}{log['node'].pk}/").status_code == 404


def test_a_user_in_no_team_sees_only_their_own_and_anonymous_nothing(
        log: dict[str, AuditEntry], teams: dict[str, Team]) -> None:
    loner = User.objects.create_user("loner", password="loner-pass-123")
    mine = entry("token.create", by=loner, object_type="credentials.apitoken")
    assert ids(api(loner).get(LIST)) == [mine.pk]
    for url in (LIST, EXPORT, f"{LIST}{mine.pk}/"):
        assert APIClient().get(url).status_code in (401, 403)
    # A session opened before the account was deactivated opens nothing after.
    session = APIClient()
    session.force_login(loner)
    assert ids(session.get(LIST)) == [mine.pk]
    loner.is_active = False
    loner.save()
    assert session.get(LIST).status_code in (401, 403)


# ---- append only -------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "trace"])
def test_no_write_method_exists_on_the_api(owner: User, log: dict[str, AuditEntry],
                                           method: str) -> None:
    client = api(owner)
    pk = log["red_edit"].pk
    for url in (LIST, f"{LIST}{pk}/", EXPORT):
        response = client.generic(method.upper(), url, json.dumps({"action": "x.y"}),
                                  content_type="application/json", HTTP_ACCEPT="*/*")
        assert response.status_code == 405, (method, url)
        # In JSON on the export too, whose renderers (CSV, JSON lines) had made it one word.
        assert response["Content-Type"] == "application/json", (method, url)
        assert "not allowed" in response.json()["detail"], (method, url)
    assert AuditEntry.objects.get(pk=pk).action == "deployment.edit"
    assert AuditEntry.objects.count() == len(log)


def test_the_orm_refuses_to_change_or_delete_an_entry(log: dict[str, AuditEntry]) -> None:
    edit = log["red_edit"]
    edit.action = "deployment.forged"
    with pytest.raises(AppendOnly):
        edit.save()
    with pytest.raises(AppendOnly):
        edit.delete()
    with pytest.raises(AppendOnly):
        AuditEntry.objects.filter(pk=edit.pk).update(action="deployment.forged")
    with pytest.raises(AppendOnly):
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.get(pk=edit.pk).action == "deployment.edit"
    assert AuditEntry.objects.count() == len(log)


def test_the_admin_shows_entries_and_refuses_to_add_change_or_delete(
        owner: User, log: dict[str, AuditEntry]) -> None:
    client = Client()
    client.force_login(owner)
    pk = log["red_edit"].pk
    base = "/admin/audit/auditentry/"
    listed = client.get(base)
    assert listed.status_code == 200 and b"deployment.edit" in listed.content
    assert b"delete_selected" not in listed.content
    shown = client.get(f"{base}{pk}/change/")
    assert shown.status_code == 200 and b'name="action"' not in shown.content
    assert client.post(f"{base}{pk}/change/", {"action": "x.forged"}).status_code == 403
    assert client.post(f"{base}{pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{base}add/", {"action": "x.forged"}).status_code == 403
    assert client.post(base, {"action": "delete_selected", "_selected_action": [pk],
                              "post": "yes"}).status_code in (200, 302)
    assert AuditEntry.objects.count() == len(log)
    assert AuditEntry.objects.get(pk=pk).action == "deployment.edit"


# ---- the page ----------------------------------------------------------------------------------

def page(user: User, query: str = "") -> tuple[int, str]:
    client = Client()
    client.force_login(user)
    response = client.get(f"/audit/?{query}")
    return response.status_code, response.content.decode()


def test_the_page_shows_the_visible_entries_with_their_diff(
        alice: User, log: dict[str, AuditEntry]) -> None:
    status, html = page(alice)
    assert status == 200
    assert f'data-entry="{log["red_edit"].pk}"' in html
    assert f'data-entry="{log["blue_key"].pk}"' not in html
    assert f'data-entry="{log["node"].pk}"' not in html
    assert "max_model_len" in html and "2048" in html and "4096" in html
    assert "10.0.0.7" in html and "owner" in html


def test_the_page_filters_and_its_export_links_keep_the_filters(
        owner: User, log: dict[str, AuditEntry]) -> None:
    status, html = page(owner, "action=deployment.&user=owner&object_id=")
    assert status == 200
    assert f'data-entry="{log["red_edit"].pk}"' in html
    assert f'data-entry="{log["red_start"].pk}"' not in html
    exports = re.findall(r'href="/api/v1/audit/export/?\?([^"]*)" class="export"', html)
    assert len(exports) == 2
    for link in exports:
        assert "user=owner" in link and "action=deployment." in link
        assert "object_id" not in link
    client = api(owner)
    for link in exports:
        body = client.get(f"{EXPORT}?{link.replace('&amp;', '&')}").content.decode()
        assert "deployment.edit" in body and "deployment.start" not in body


def test_the_page_answers_a_bad_filter_with_400_and_the_fields_error(owner: User) -> None:
    status, html = page(owner, "since=not-a-time")
    assert status == 400
    assert "has-error" in html and "Enter a valid date/time" in html


def test_the_page_pages_through_many_entries(owner: User) -> None:
    for minute in range(55):
        entry("deployment.start", by=owner, minutes=minute)
    status, html = page(owner, "user=owner")
    assert status == 200 and html.count("data-entry=") == 50
    assert "page=2" in html and "user=owner" in html
    status, html = page(owner, "user=owner&page=2")
    assert html.count("data-entry=") == 5


def test_the_nav_links_the_page(owner: User) -> None:
    assert 'href="/audit/"' in page(owner)[1]


def test_the_list_export_and_page_queries_do_not_grow_with_entries(
        alice: User, teams: dict[str, Team]) -> None:
    def counts() -> list[int]:
        found = []
        session = APIClient()
        session.force_login(alice)
        for url in (LIST, f"{EXPORT}?format=csv", "/audit/"):
            with CaptureQueriesContext(connection) as queries:
                assert session.get(url).status_code == 200
            found.append(len(queries))
        return found

    entry("deployment.start", by=alice, team=teams["red"])
    few = counts()
    for minute in range(30):
        entry("deployment.start", by=alice, team=teams["red"], minutes=minute)
    assert counts() == few


def test_a_user_with_entries_cannot_be_deleted_only_deactivated() -> None:
    user = User.objects.create_user("leaver", "", "pw")
    with acting_as("command", "test", user=user):
        record("user.edit", user, before={"first_name": ""}, after={"first_name": "L"})
    with pytest.raises(ProtectedError):
        user.delete()
    assert AuditEntry.objects.filter(username="leaver").count() == 1
