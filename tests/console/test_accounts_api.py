"""Teams, members and users, managed over REST and on the pages: who may do what (superuser,
team admin, operator, viewer, outsider), a team that keeps its last admin, users deactivated
and never deleted nor shown with a password hash, and one audit entry per change naming who."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.accounts import services
from console.accounts.models import DEFAULT_TEAM, Membership, Role, Team
from console.accounts.roles import roles_of
from console.audit.entries import MASK
from console.audit.models import AuditEntry
from console.deployments.models import Deployment

pytestmark = pytest.mark.django_db

TEAMS = "/api/v1/teams/"
USERS = "/api/v1/users/"
PASSWORD = "a-long-password-1"


def api(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def browser(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def member(team: Team, name: str, role: Role) -> User:
    user = User.objects.create_user(name, password=PASSWORD)
    Membership.objects.create(team=team, user=user, role=role)
    return user


@pytest.fixture
def red(db: None) -> Team:
    return Team.objects.create(name="red", description="the red team")


@pytest.fixture
def admin(red: Team) -> User:
    return member(red, "ada", Role.ADMIN)


@pytest.fixture
def operator(red: Team) -> User:
    return member(red, "otto", Role.OPERATOR)


@pytest.fixture
def viewer(red: Team) -> User:
    return member(red, "vera", Role.VIEWER)


@pytest.fixture
def stranger(db: None) -> User:
    """A member of another team: red does not exist for them."""
    return member(Team.objects.create(name="blue"), "sam", Role.ADMIN)


@contextmanager
def one_entry(action: str, by: User, **fields: object) -> Iterator[list[AuditEntry]]:
    """The block writes exactly one audit entry: ``action``, by ``by``, from the test client."""
    before = AuditEntry.objects.count()
    found: list[AuditEntry] = []
    yield found
    entries = list(AuditEntry.objects.order_by("pk")[before:])
    assert [(e.action, e.username, e.actor) for e in entries] == [(action, by.username, "user")]
    assert entries[0].address == "127.0.0.1"
    for field, value in fields.items():
        assert getattr(entries[0], field) == value, field
    found.extend(entries)


@contextmanager
def no_entry() -> Iterator[None]:
    before = AuditEntry.objects.count()
    yield
    assert AuditEntry.objects.count() == before


# ---- teams -------------------------------------------------------------------------------------

def test_a_member_lists_their_teams_a_superuser_all_and_red_is_a_404_to_others(
        owner: User, admin: User, viewer: User, stranger: User, red: Team) -> None:
    names = lambda client: [t["name"] for t in client.get(TEAMS).json()["results"]]  # noqa: E731
    assert names(api(owner)) == list(Team.objects.order_by("name").values_list("name", flat=True))
    assert {"blue", "red"} < set(names(api(owner)))
    assert names(api(viewer)) == ["red"]
    assert names(api(stranger)) == ["blue"]
    assert api(viewer).get(f"{TEAMS}{red.pk}/").json()["description"] == "the red team"
    assert api(stranger).get(f"{TEAMS}{red.pk}/").status_code == 404
    assert api(stranger).get(f"{TEAMS}{red.pk}/members/").status_code == 404
    assert APIClient().get(TEAMS).status_code in (401, 403)


def test_a_superuser_creates_a_team_and_no_one_else_may(owner: User, admin: User) -> None:
    with no_entry():
        assert api(admin).post(TEAMS, {"name": "green"}, format="json").status_code == 403
    with one_entry("team.create", owner, object_repr="green") as entries:
        created = api(owner).post(TEAMS, {"name": "green", "description": "new"}, format="json")
    assert created.status_code == 201, created.content
    assert entries[0].team_id == created.json()["id"]
    assert entries[0].changes == {"description": [None, "new"], "name": [None, "green"]}
    for body, field in (({"name": "green"}, "name"), ({"name": "not a slug"}, "name"),
                        ({"name": "x" * 65}, "name"), ({}, "name")):
        response = api(owner).post(TEAMS, body, format="json")
        assert response.status_code == 400 and field in response.json(), body


def test_a_team_admin_edits_the_team_an_operator_may_not(
        admin: User, operator: User, stranger: User, red: Team) -> None:
    url = f"{TEAMS}{red.pk}/"
    with no_entry():
        assert api(operator).patch(url, {"description": "x"}, format="json").status_code == 403
        assert api(stranger).patch(url, {"description": "x"}, format="json").status_code == 404
    with one_entry("team.edit", admin, team_id=red.pk) as entries:
        response = api(admin).patch(url, {"description": "renamed", "name": "crimson"},
                                    format="json")
    assert response.status_code == 200 and response.json()["name"] == "crimson"
    assert entries[0].changes == {"description": ["the red team", "renamed"],
                                  "name": ["red", "crimson"]}


def test_the_default_team_keeps_its_name(owner: User) -> None:
    team, _ = Team.objects.get_or_create(name=DEFAULT_TEAM)
    with no_entry():
        response = api(owner).patch(f"{TEAMS}{team.pk}/", {"name": "other"}, format="json")
    assert response.status_code == 409 and "keeps its name" in response.json()["detail"]


def test_only_a_superuser_deletes_a_team_and_not_one_that_owns_deployments(
        owner: User, admin: User, red: Team, deployment: Deployment) -> None:
    with no_entry():
        assert api(admin).delete(f"{TEAMS}{red.pk}/").status_code == 403
        busy = api(owner).delete(f"{TEAMS}{deployment.team_id}/")
    assert busy.status_code == 409 and "deployments" in busy.json()["detail"]
    assert Team.objects.filter(pk=deployment.team_id).exists()
    with one_entry("team.delete", owner, object_id=str(red.pk), team_id=red.pk) as entries:
        assert api(owner).delete(f"{TEAMS}{red.pk}/").status_code == 204
    assert not Team.objects.filter(pk=red.pk).exists()
    assert not Membership.objects.filter(user=admin).exists()
    assert entries[0].changes == {"description": ["the red team", None], "name": ["red", None]}


# ---- members -----------------------------------------------------------------------------------

def test_members_are_listed_to_every_member_with_their_roles(
        viewer: User, admin: User, red: Team) -> None:
    response = api(viewer).get(f"{TEAMS}{red.pk}/members/")
    assert response.status_code == 200
    assert [(m["username"], m["role"]) for m in response.json()["results"]] == [
        ("ada", "admin"), ("vera", "viewer")]


def test_a_team_admin_adds_changes_and_removes_members(admin: User, red: Team) -> None:
    newcomer = User.objects.create_user("nina", password=PASSWORD)
    client = api(admin)
    members = f"{TEAMS}{red.pk}/members/"
    with one_entry("member.add", admin, team_id=red.pk) as entries:
        added = client.post(members, {"user": "nina", "role": "operator"}, format="json")
    assert added.status_code == 201 and added.json() == {
        "user": newcomer.pk, "username": "nina", "role": "operator"}
    assert entries[0].changes == {"role": [None, "operator"], "team": [None, red.pk],
                                  "user": [None, newcomer.pk]}
    with one_entry("member.role", admin, team_id=red.pk) as entries:
        changed = client.patch(f"{members}{newcomer.pk}/", {"role": "admin"}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "admin"
    assert entries[0].changes == {"role": ["operator", "admin"]}
    with one_entry("member.remove", admin, team_id=red.pk) as entries:
        assert client.delete(f"{members}{newcomer.pk}/").status_code == 204
    assert entries[0].changes["role"] == ["admin", None]
    assert not Membership.objects.filter(user=newcomer).exists()
    assert client.delete(f"{members}{newcomer.pk}/").status_code == 404


def test_adding_refuses_an_unknown_inactive_or_present_user_and_a_bad_role(
        admin: User, viewer: User, red: Team) -> None:
    User.objects.create_user("gone", password=PASSWORD, is_active=False)
    members = f"{TEAMS}{red.pk}/members/"
    with no_entry():
        for body, field in (({"user": "nobody"}, "user"), ({"user": "gone"}, "user"),
                            ({"user": "vera", "role": "owner"}, "role"), ({}, "user")):
            response = api(admin).post(members, body, format="json")
            assert response.status_code == 400 and field in response.json(), body
        present = api(admin).post(members, {"user": "vera"}, format="json")
    assert present.status_code == 409 and "already a member" in present.json()["detail"]


def test_operators_viewers_and_outsiders_may_not_touch_members(
        operator: User, viewer: User, stranger: User, admin: User, red: Team) -> None:
    members = f"{TEAMS}{red.pk}/members/"
    with no_entry():
        for user, status in ((operator, 403), (viewer, 403), (stranger, 404)):
            client = api(user)
            assert client.post(members, {"user": "sam"}, format="json").status_code == status
            assert client.patch(f"{members}{viewer.pk}/", {"role": "admin"},
                                format="json").status_code == status
            assert client.delete(f"{members}{admin.pk}/").status_code == status
    assert Membership.objects.get(user=viewer).role == Role.VIEWER


def test_a_team_keeps_at_least_one_admin(owner: User, admin: User, viewer: User,
                                         red: Team) -> None:
    members = f"{TEAMS}{red.pk}/members/"
    with no_entry():
        demoted = api(admin).patch(f"{members}{admin.pk}/", {"role": "operator"}, format="json")
        removed = api(owner).delete(f"{members}{admin.pk}/")
    for response in (demoted, removed):
        assert response.status_code == 409
        assert "must keep an admin" in response.json()["detail"]
    assert Membership.objects.get(user=admin).role == Role.ADMIN
    # With a second admin, the first may step down.
    api(admin).patch(f"{members}{viewer.pk}/", {"role": "admin"}, format="json")
    assert api(admin).patch(f"{members}{admin.pk}/", {"role": "viewer"},
                            format="json").status_code == 200


def test_a_membership_change_is_seen_by_the_same_user_object_at_once(red: Team) -> None:
    newcomer = User.objects.create_user("nina", password=PASSWORD)
    assert roles_of(newcomer) == {}
    services.add_member(red, newcomer, Role.VIEWER)
    assert roles_of(newcomer) == {red.pk: Role.VIEWER}


# ---- users -------------------------------------------------------------------------------------

def test_only_a_superuser_reaches_users(admin: User) -> None:
    with no_entry():
        assert api(admin).get(USERS).status_code == 403
        assert api(admin).post(USERS, {"username": "x", "password": PASSWORD},
                               format="json").status_code == 403
        assert api(admin).patch(f"{USERS}{admin.pk}/", {"is_superuser": True},
                                format="json").status_code == 403
    assert not User.objects.get(pk=admin.pk).is_superuser


def test_a_superuser_creates_a_user_who_can_log_in_and_no_hash_is_shown(owner: User) -> None:
    with one_entry("user.create", owner, object_repr="nina") as entries:
        created = api(owner).post(USERS, {"username": "nina", "password": PASSWORD,
                                          "email": "nina@example.com"}, format="json")
    assert created.status_code == 201, created.content
    assert "password" not in created.json() and created.json()["is_active"] is True
    assert entries[0].changes["password"] == [None, MASK]
    assert entries[0].changes["username"] == [None, "nina"]
    nina = User.objects.get(username="nina")
    assert nina.check_password(PASSWORD) and not nina.is_superuser
    listed = api(owner).get(USERS).content.decode()
    assert "nina@example.com" in listed and nina.password not in listed
    assert "pbkdf2" not in listed and "md5$" not in listed


@pytest.mark.parametrize(("body", "field"), [
    ({"username": "nina", "password": "short"}, "password"),
    ({"username": "nina"}, "password"),
    ({"username": "owner", "password": PASSWORD}, "username"),
    ({"username": "bad name!", "password": PASSWORD}, "username"),
    ({"username": "nina", "password": PASSWORD, "is_active": False}, "is_active"),
])
def test_a_bad_new_user_is_a_400_naming_the_field(owner: User, body: dict[str, object],
                                                  field: str) -> None:
    with no_entry():
        response = api(owner).post(USERS, body, format="json")
    assert response.status_code == 400 and list(response.json()) == [field]


def test_a_user_is_deactivated_never_deleted(owner: User, admin: User) -> None:
    url = f"{USERS}{admin.pk}/"
    with no_entry():
        assert api(owner).delete(url).status_code == 405
        assert api(owner).put(url, {"username": "ada"}, format="json").status_code == 405
    session = api(admin)
    assert session.get(TEAMS).status_code == 200
    with one_entry("user.deactivate", owner, object_id=str(admin.pk)) as entries:
        response = api(owner).patch(url, {"is_active": False}, format="json")
    assert response.status_code == 200 and response.json()["is_active"] is False
    assert entries[0].changes == {"is_active": [True, False]}
    assert session.get(TEAMS).status_code in (401, 403)
    with one_entry("user.activate", owner):
        api(owner).patch(url, {"is_active": True}, format="json")
    assert User.objects.get(pk=admin.pk).is_active


def test_a_superuser_sets_superuser_and_password_but_not_on_themself(
        owner: User, admin: User) -> None:
    with one_entry("user.edit", owner) as entries:
        response = api(owner).patch(f"{USERS}{admin.pk}/",
                                    {"is_superuser": True, "password": "another-password-2"},
                                    format="json")
    assert response.status_code == 200, response.content
    assert entries[0].changes == {"is_superuser": [False, True], "password": [MASK, MASK]}
    promoted = User.objects.get(pk=admin.pk)
    assert promoted.is_superuser and promoted.is_staff
    assert promoted.check_password("another-password-2")
    with no_entry():
        for body in ({"is_active": False}, {"is_superuser": False}):
            refused = api(owner).patch(f"{USERS}{owner.pk}/", body, format="json")
            assert refused.status_code == 409 and "yourself" in refused.json()["detail"]
        renamed = api(owner).patch(f"{USERS}{admin.pk}/", {"username": "eve"}, format="json")
    assert renamed.status_code == 400 and "username" in renamed.json()
    # Another superuser may take it away.
    with one_entry("user.edit", promoted):
        api(promoted).patch(f"{USERS}{owner.pk}/", {"is_superuser": False}, format="json")
    assert not User.objects.get(pk=owner.pk).is_superuser


# ---- pages -------------------------------------------------------------------------------------

def test_the_teams_page_offers_creating_to_a_superuser_only(
        owner: User, admin: User, red: Team) -> None:
    mine = browser(admin).get("/teams/").content.decode()
    assert 'data-team="red"' in mine and 'id="team-form"' not in mine
    assert 'href="/teams/"' in mine and 'href="/users/"' not in mine
    with no_entry():
        assert browser(admin).post("/teams/", {"name": "green"}).status_code == 403
    assert 'id="team-form"' in browser(owner).get("/teams/").content.decode()
    with one_entry("team.create", owner):
        response = browser(owner).post("/teams/", {"name": "green"})
    assert response.status_code == 302 and response["Location"] == "/teams/green/"
    assert browser(owner).post("/teams/", {"name": "green"}).status_code == 400


def test_the_team_page_shows_member_forms_to_team_admins_only(
        admin: User, viewer: User, stranger: User, red: Team) -> None:
    as_admin = browser(admin).get("/teams/red/").content.decode()
    as_viewer = browser(viewer).get("/teams/red/").content.decode()
    for form in ('id="member-form"', 'class="inline role"', 'class="inline remove"',
                 'id="team-edit-form"'):
        assert form in as_admin and form not in as_viewer
    assert 'data-member="vera"' in as_viewer and "team-delete-form" not in as_admin
    assert browser(stranger).get("/teams/red/").status_code == 404
    with no_entry():
        assert browser(viewer).post("/teams/red/members/", {"user": "sam"}).status_code == 403
        assert browser(viewer).post(f"/teams/red/members/{admin.pk}/remove/").status_code == 403
        assert browser(stranger).post("/teams/red/edit/", {"name": "red"}).status_code == 404


def test_a_team_admin_manages_members_on_the_page(admin: User, viewer: User, red: Team) -> None:
    page = browser(admin)
    User.objects.create_user("nina", password=PASSWORD)
    with one_entry("member.add", admin):
        assert page.post("/teams/red/members/", {"user": "nina", "role": "viewer"}).status_code == 302
    nina = User.objects.get(username="nina")
    with one_entry("member.role", admin):
        page.post(f"/teams/red/members/{nina.pk}/role/", {"role": "operator"})
    with one_entry("member.remove", admin):
        page.post(f"/teams/red/members/{nina.pk}/remove/")
    with no_entry():
        refused = page.post(f"/teams/red/members/{admin.pk}/role/", {"role": "viewer"})
    assert refused.status_code == 409 and "must keep an admin" in refused.content.decode()
    with one_entry("team.edit", admin):
        assert page.post("/teams/red/edit/", {"name": "red", "description": "d"}).status_code == 302
    assert Team.objects.get(pk=red.pk).description == "d"


def test_the_users_page_is_a_superusers(owner: User, admin: User) -> None:
    assert browser(admin).get("/users/").status_code == 403
    html = browser(owner).get("/users/").content.decode()
    assert 'data-user="ada"' in html and 'href="/users/"' in html
    # No button to deactivate oneself.
    assert f'/users/{owner.pk}/deactivate/' not in html and f'/users/{admin.pk}/deactivate/' in html
    with one_entry("user.create", owner):
        created = browser(owner).post("/users/", {"username": "nina", "password": PASSWORD})
    assert created.status_code == 302
    assert browser(owner).post("/users/", {"username": "x", "password": "short"}).status_code == 400
    with one_entry("user.deactivate", owner):
        browser(owner).post(f"/users/{admin.pk}/deactivate/")
    assert not User.objects.get(pk=admin.pk).is_active
    with no_entry():
        assert browser(admin).post(f"/users/{owner.pk}/deactivate/").status_code in (302, 403)
        assert browser(owner).post(f"/users/{owner.pk}/deactivate/").status_code == 409


def test_the_team_and_user_lists_queries_do_not_grow_with_rows(owner: User, red: Team) -> None:
    def counts() -> list[int]:
        found = []
        for client, url in ((api(owner), TEAMS), (api(owner), f"{TEAMS}{red.pk}/members/"),
                            (api(owner), USERS), (browser(owner), "/teams/"),
                            (browser(owner), "/teams/red/"), (browser(owner), "/users/")):
            with CaptureQueriesContext(connection) as queries:
                assert client.get(url).status_code == 200, url
            found.append(len(queries))
        return found

    # One row each first: an empty page is one query fewer (no rows to fetch).
    member(red, "first", Role.ADMIN)
    few = counts()
    for n in range(12):
        member(red, f"user{n}", Role.VIEWER)
        Team.objects.create(name=f"team{n}")
    assert counts() == few
