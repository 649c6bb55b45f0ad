"""API tokens: made by login or by a user, shown once and stored as a hash, expiring, revocable,
listed per user with their last use, on the API and on the API tokens page; every make and
revoke audited."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from console.audit.models import AuditEntry
from console.credentials.models import ApiToken
from tests.console.passwords import OUTSIDER_PASSWORD, OWNER_PASSWORD
from tests.console.tokens import token_for

pytestmark = pytest.mark.django_db

LOGIN_URL = "/api/v1/auth/token/"
TOKENS_URL = "/api/v1/tokens/"
ALICE_PASSWORD = "alice-pass-123"


@pytest.fixture
def alice(db: None) -> User:
    """A user who is no superuser: she sees her own tokens only."""
    return User.objects.create_user(username="alice", password=ALICE_PASSWORD)


def with_token(secret: str, keyword: str = "Token") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{keyword} {secret}")
    return client


def login(username: str, password: str, **fields: object) -> dict[str, object]:
    response = APIClient().post(LOGIN_URL, {"username": username, "password": password, **fields},
                                format="json")
    assert response.status_code == 201, response.content
    return response.json()


# ---- the secret -----------------------------------------------------------------------------------

def test_a_login_answers_a_new_token_shown_once_and_stored_as_its_hash(owner: User) -> None:
    first = login("owner", OWNER_PASSWORD)
    second = login("owner", OWNER_PASSWORD, name="nightly", expires_in_days=2)
    assert first["token"] != second["token"]
    token = ApiToken.objects.get(pk=second["id"])
    secret = str(second["token"])
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret.startswith(token.prefix) and len(token.prefix) < len(secret) // 3
    assert (token.name, token.user) == ("nightly", owner)
    assert abs(token.expires_at - (timezone.now() + timedelta(days=2))) < timedelta(minutes=1)
    # The secret is in no column and no later answer.
    stored = ApiToken.objects.filter(pk=token.pk).values().get()
    assert secret not in {str(value) for value in stored.values()}
    listed = with_token(secret).get(TOKENS_URL).content.decode()
    assert token.prefix in listed and secret not in listed


def test_a_token_opens_the_api_as_its_user_with_either_keyword(owner: User) -> None:
    secret = token_for(owner)
    for keyword in ("Token", "Bearer", "bearer"):
        response = with_token(secret, keyword).get(TOKENS_URL)
        assert response.status_code == 200, (keyword, response.content)
        assert response.json()["results"][0]["username"] == "owner"


@pytest.mark.parametrize(("header", "detail"), [
    ("Token pdt_not-a-token", "Invalid token."),
    ("Token", "Invalid Authorization header"),
    ("Bearer a b", "Invalid Authorization header"),
])
def test_a_bad_token_is_401_saying_why(owner: User, header: str, detail: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get(TOKENS_URL)
    assert response.status_code == 401
    assert detail in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Token")


def test_without_credentials_the_api_answers_401() -> None:
    response = APIClient().get(TOKENS_URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Token")


def test_an_expired_token_is_refused_saying_when_it_expired(owner: User) -> None:
    secret = token_for(owner)
    assert with_token(secret).get(TOKENS_URL).status_code == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = with_token(secret).get(TOKENS_URL)
    assert response.status_code == 401
    assert "expired at" in response.json()["detail"]


def test_a_token_of_a_deactivated_user_is_refused(outsider: User) -> None:
    response = with_token(token_for(outsider)).get(TOKENS_URL)
    assert response.status_code == 401
    assert response.json()["detail"] == "User inactive or deleted."


# ---- expiry -------------------------------------------------------------------------------------

def test_a_token_lives_30_days_unless_asked_within_a_year(owner: User) -> None:
    api = with_token(token_for(owner))
    made = api.post(TOKENS_URL, {"name": "default"}, format="json")
    assert made.status_code == 201, made.content
    expires = ApiToken.objects.get(pk=made.json()["id"]).expires_at
    assert abs(expires - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert api.post(TOKENS_URL, {"name": "long", "expires_in_days": 365},
                    format="json").status_code == 201
    before = ApiToken.objects.count()
    for days in (0, -1, 366, 10**20, "soon"):
        refused = api.post(TOKENS_URL, {"name": "x", "expires_in_days": days}, format="json")
        assert refused.status_code == 400, days
        assert "expires_in_days" in refused.json(), (days, refused.json())
    refused = api.post(TOKENS_URL, {"name": ""}, format="json")
    assert refused.status_code == 400 and "name" in refused.json()
    assert ApiToken.objects.count() == before


# ---- last use -----------------------------------------------------------------------------------

def _token_writes(client: APIClient) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(TOKENS_URL).status_code == 200
    return sum(1 for query in queries.captured_queries
               if query["sql"].startswith("UPDATE") and "credentials_apitoken" in query["sql"])


def test_last_use_is_written_at_most_once_a_minute(owner: User) -> None:
    secret = token_for(owner)
    token = ApiToken.objects.get()
    assert token.last_used_at is None
    client = with_token(secret)
    assert _token_writes(client) == 1
    first_use = ApiToken.objects.get().last_used_at
    assert first_use is not None
    assert _token_writes(client) == 0
    assert ApiToken.objects.get().last_used_at == first_use
    ApiToken.objects.update(last_used_at=first_use - timedelta(seconds=61))
    assert _token_writes(client) == 1
    assert ApiToken.objects.get().last_used_at > first_use
    listed = client.get(TOKENS_URL).json()["results"][0]
    assert listed["last_used_at"] is not None and listed["state"] == "active"


@contextlib.contextmanager
def another_writer_holds_the_tokens() -> Iterator[None]:
    """A second connection holds the write lock the last-use note needs (on SQLite the
    database's, on PostgreSQL the token table's), as the supervisor's promotion of a rollout
    does on a saturated host."""
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            if other.vendor == "sqlite":
                cursor.execute("DELETE FROM django_session WHERE 0")  # takes the write lock
            else:
                cursor.execute(f"LOCK TABLE {ApiToken._meta.db_table} IN EXCLUSIVE MODE")
        yield
    finally:
        other.rollback()
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_read_is_answered_while_another_writer_holds_the_database(
        owner: User, caplog: pytest.LogCaptureFixture) -> None:
    """CI saw GET /api/v1/rollouts/1/ answered 500 'database is locked' at a promotion under
    load: the GET's only write is the token's last use, which must not fail the call."""
    secret = token_for(owner)
    with another_writer_holds_the_tokens():
        started = time.monotonic()
        response = with_token(secret).get(TOKENS_URL)
        waited = time.monotonic() - started
    assert response.status_code == 200, response.content
    assert waited < 10, f"the note waited {waited:.1f} s for the lock"
    assert ApiToken.objects.get().last_used_at is None  # left for the next call
    assert any("last use is not recorded" in r.getMessage() for r in caplog.records)
    assert with_token(secret).get(TOKENS_URL).status_code == 200
    assert ApiToken.objects.get().last_used_at is not None


# ---- listing and revoking -----------------------------------------------------------------------

def test_a_user_lists_her_own_tokens_and_a_superuser_everyones(owner: User, alice: User) -> None:
    owners, alices = token_for(owner, "owner's"), token_for(alice, "alice's")
    mine = with_token(alices).get(TOKENS_URL).json()
    assert [t["name"] for t in mine["results"]] == ["alice's"]
    everyone = with_token(owners).get(TOKENS_URL).json()
    assert sorted(t["name"] for t in everyone["results"]) == ["alice's", "owner's"]
    only_alice = with_token(owners).get(TOKENS_URL, {"user": alice.pk}).json()
    assert [t["username"] for t in only_alice["results"]] == ["alice"]
    # Asking for another user's tokens shows a plain user nothing more.
    assert with_token(alices).get(TOKENS_URL, {"user": owner.pk}).json()["results"] == []
    owner_token = ApiToken.objects.get(user=owner)
    assert with_token(alices).get(f"{TOKENS_URL}{owner_token.pk}/").status_code == 404


@pytest.mark.parametrize("value", ["alice", "0", "-1", "99999999999999999999"])
def test_a_bad_user_filter_is_400_naming_it(owner: User, value: str) -> None:
    response = with_token(token_for(owner)).get(TOKENS_URL, {"user": value})
    assert response.status_code == 400
    assert "user" in response.json()


def test_a_revoked_token_is_refused_from_its_next_call(owner: User) -> None:
    secret = token_for(owner, "leaked")
    other = with_token(token_for(owner, "admin's"))
    leaked = ApiToken.objects.get(name="leaked")
    revoked = other.post(f"{TOKENS_URL}{leaked.pk}/revoke")
    assert revoked.status_code == 200
    assert revoked.json()["state"] == "revoked" and revoked.json()["revoked_at"]
    response = with_token(secret).get(TOKENS_URL)
    assert response.status_code == 401
    assert "was revoked at" in response.json()["detail"]
    # Revoking twice keeps the first time.
    first = ApiToken.objects.get(pk=leaked.pk).revoked_at
    assert other.post(f"{TOKENS_URL}{leaked.pk}/revoke/").json()["revoked_at"] == revoked.json()["revoked_at"]
    assert ApiToken.objects.get(pk=leaked.pk).revoked_at == first


def test_a_user_cannot_revoke_another_users_token(owner: User, alice: User) -> None:
    token_for(owner)
    target = ApiToken.objects.get(user=owner)
    response = with_token(token_for(alice)).post(f"{TOKENS_URL}{target.pk}/revoke")
    assert response.status_code == 404
    assert ApiToken.objects.get(pk=target.pk).revoked_at is None


# ---- the login endpoint ---------------------------------------------------------------------------

def test_a_wrong_password_or_a_deactivated_account_gets_no_token(owner: User, outsider: User) -> None:
    before = ApiToken.objects.count()
    for username, password in (("owner", "wrong"), ("outsider", OUTSIDER_PASSWORD),
                               ("nobody", "x")):
        response = APIClient().post(LOGIN_URL, {"username": username, "password": password},
                                    format="json")
        assert response.status_code == 400, username
        assert "token" not in response.json() and "non_field_errors" in response.json()
    assert ApiToken.objects.count() == before


def test_a_script_logs_in_with_a_form_and_a_stale_token_in_its_headers(owner: User) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token pdt_expired-long-ago")
    response = client.post(LOGIN_URL, {"username": "owner", "password": OWNER_PASSWORD})
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    assert with_token(response.json()["token"]).get(TOKENS_URL).status_code == 200


@pytest.mark.parametrize(("fields", "field"), [
    ({"password": OWNER_PASSWORD}, "username"),
    ({"username": "owner"}, "password"),
    ({"username": "owner", "password": OWNER_PASSWORD, "expires_in_days": 400}, "expires_in_days"),
    ({"username": "owner", "password": OWNER_PASSWORD, "name": "n" * 101}, "name"),
    ({"username": "o\x00wner", "password": OWNER_PASSWORD}, "username"),
])
def test_bad_login_input_is_400_naming_the_field(owner: User, fields: dict[str, object],
                                                 field: str) -> None:
    response = APIClient().post(LOGIN_URL, fields, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()


# ---- audit ----------------------------------------------------------------------------------------

def test_making_and_revoking_a_token_each_write_one_audit_entry(owner: User) -> None:
    made = login("owner", OWNER_PASSWORD, name="ci")
    entry = AuditEntry.objects.get(action="api_token.create")
    assert (entry.username, entry.object_id, entry.object_repr) == ("owner", str(made["id"]),
                                                                     f"ci ({made['prefix']}…)")
    assert entry.changes["name"] == [None, "ci"]
    assert str(made["token"]) not in str(entry.changes)

    client = with_token(str(made["token"]))
    client.post(f"{TOKENS_URL}{made['id']}/revoke")
    client = with_token(token_for(owner, "second"))
    client.post(f"{TOKENS_URL}{made['id']}/revoke")  # again: nothing changes, nothing recorded
    revoked = AuditEntry.objects.get(action="api_token.revoke")
    assert revoked.username == "owner" and revoked.actor == AuditEntry.Actor.TOKEN
    assert revoked.via == made["prefix"]  # revoked with the token itself
    assert revoked.changes["revoked_at"][0] is None and revoked.changes["revoked_at"][1]
    assert AuditEntry.objects.filter(action="api_token.create").count() == 2


# ---- the page -------------------------------------------------------------------------------------

def test_the_page_lists_makes_shows_once_and_revokes_own_tokens(owner: User, alice: User) -> None:
    token_for(owner, "owner's script")
    client = Client()
    client.force_login(alice)
    page = client.get("/tokens/")
    assert page.status_code == 200 and b"No tokens yet" in page.content
    assert b'href="/tokens/"' in page.content  # the nav links here

    created = client.post("/tokens/new/", {"name": "laptop", "expires_in_days": "7"})
    assert created.status_code == 201
    assert created["Cache-Control"] == "no-store"
    body = created.content.decode()
    secret = body.split('id="new-token-value">')[1].split("<")[0]
    token = ApiToken.objects.get(user=alice)
    assert hashlib.sha256(secret.encode()).hexdigest() == token.secret_hash

    listed = client.get("/tokens/").content.decode()
    assert secret not in listed and f"{token.prefix}…" in listed and "never" in listed
    assert "owner's script" not in listed

    with_token(secret).get(TOKENS_URL)
    listed = client.get("/tokens/").content.decode()
    assert "never" not in listed and "ago" in listed

    assert client.post(f"/tokens/{token.pk}/revoke/").status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert "revoked" in client.get("/tokens/").content.decode()
    others = ApiToken.objects.get(user=owner)
    assert client.post(f"/tokens/{others.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=others.pk).revoked_at is None

    refused = client.post("/tokens/new/", {"name": "forever", "expires_in_days": "5000"})
    assert refused.status_code == 400
    assert b'field-error">Ensure this value is less than or equal to 365' in refused.content
    assert ApiToken.objects.filter(user=alice).count() == 1


def test_the_page_needs_a_login() -> None:
    client = Client()
    response = client.get("/tokens/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    response = client.post("/tokens/new/", {"name": "x", "expires_in_days": "1"})
    assert response.status_code == 302 and not ApiToken.objects.exists()
