"""Login rate limiting (django-axes): after 5 failed logins for one username from one address,
the next login of that user from that address is refused with 429 for 15 minutes, even with the
right password; the same user from elsewhere still logs in (an outsider cannot lock the
superuser out). PDSERVE_LOGIN_LOCKOUT=user locks the username out from anywhere, and
user-or-address also every username from the address. On the login page, on the API's token
login and under ASGI."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.db.models import F
from django.http import HttpResponse
from django.test import AsyncClient, Client

from console.credentials.login_limits import LOCKED_SCOPE
from console.env import env_choice
from tests.console.passwords import OWNER_PASSWORD

pytestmark = pytest.mark.django_db

ALICE_PASSWORD = "alice-pass-123"
HOME, ELSEWHERE = "10.0.0.1", "10.0.0.2"

Login = Callable[[str, str, str], HttpResponse]


def api_login(username: str, password: str, address: str) -> HttpResponse:
    return Client().post("/api/v1/auth/token/", {"username": username, "password": password},
                         REMOTE_ADDR=address)


def page_login(username: str, password: str, address: str) -> HttpResponse:
    return Client().post("/login/", {"username": username, "password": password},
                         REMOTE_ADDR=address)


def logged_in(response: HttpResponse) -> bool:
    # The API answers a token; the page sends a logged-in user on with a redirect.
    return response.status_code in (201, 302)


def locked_out(response: HttpResponse) -> bool:
    return response.status_code == 429


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user(username="alice", password=ALICE_PASSWORD)


def fail(login: Login, username: str, address: str, times: int) -> HttpResponse:
    """Log in ``times`` with a wrong password; the last answer."""
    for _attempt in range(times):
        response = login(username, "wrong-password", address)
        assert not logged_in(response)
    return response


@pytest.fixture(params=[api_login, page_login], ids=["api", "page"])
def login(request: pytest.FixtureRequest) -> Login:
    return request.param


def test_the_defaults_are_5_failures_and_15_minutes() -> None:
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)


def test_the_sixth_attempt_is_refused_even_with_the_right_password(owner: User, login: Login) -> None:
    for attempt in range(4):
        assert not locked_out(fail(login, "owner", HOME, 1)), attempt
    # Four failures lock nothing, and a success does not wipe them.
    assert logged_in(login("owner", OWNER_PASSWORD, HOME))
    # The fifth failure locks the user out, and says so at once.
    assert locked_out(fail(login, "owner", HOME, 1))
    refused = login("owner", OWNER_PASSWORD, HOME)
    assert locked_out(refused)
    assert refused["Retry-After"] == "900"
    assert "locked out for 15 minutes" in refused.content.decode()


def test_the_lockout_is_per_user_and_address(owner: User, alice: User, login: Login) -> None:
    fail(login, "owner", HOME, 5)
    assert locked_out(login("owner", OWNER_PASSWORD, HOME))
    # Failures from one address do not lock the user out elsewhere: an outsider guessing the
    # superuser's password cannot keep the superuser out.
    assert logged_in(login("owner", OWNER_PASSWORD, ELSEWHERE))
    # Nor another user from the locked-out address.
    assert logged_in(login("alice", ALICE_PASSWORD, HOME))
    # Failures counted elsewhere add nothing to those at home: four more there lock nothing.
    fail(login, "owner", ELSEWHERE, 4)
    assert logged_in(login("owner", OWNER_PASSWORD, ELSEWHERE))


def test_x_forwarded_for_is_not_the_address(owner: User) -> None:
    """A client cannot spread its failures over addresses it makes up."""
    for n in range(5):
        Client().post("/login/", {"username": "owner", "password": "wrong-password"},
                      REMOTE_ADDR=HOME, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
    assert locked_out(Client().post("/login/", {"username": "owner", "password": OWNER_PASSWORD},
                                    REMOTE_ADDR=HOME, HTTP_X_FORWARDED_FOR="192.0.2.99"))


@pytest.fixture
def by_username(settings: Any) -> None:
    """PDSERVE_LOGIN_LOCKOUT=user, as settings.py turns it into axes' setting."""
    settings.PDSERVE_LOGIN_LOCKOUT = "user"
    settings.AXES_LOCKOUT_PARAMETERS = ["username"]


@pytest.mark.usefixtures("by_username")
def test_the_setting_user_locks_the_username_out_from_anywhere(owner: User, alice: User,
                                                               login: Login) -> None:
    fail(login, "owner", HOME, 5)
    # The same user from another address is still locked out: guessing from many addresses
    # gains nothing.
    refused = login("owner", OWNER_PASSWORD, ELSEWHERE)
    assert locked_out(refused)
    assert "failed logins for this user:" in refused.content.decode()
    # Another user from either address logs in.
    assert logged_in(login("alice", ALICE_PASSWORD, HOME))
    assert logged_in(login("alice", ALICE_PASSWORD, ELSEWHERE))


def test_the_setting_user_or_address_also_locks_the_address(owner: User, alice: User,
                                                            login: Login, settings: Any) -> None:
    settings.PDSERVE_LOGIN_LOCKOUT = "user-or-address"
    settings.AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
    # One address trying many usernames, none of them alice.
    for name in ("root", "admin", "owner", "operator", "test"):
        fail(login, name, HOME, 1)
    assert locked_out(login("alice", ALICE_PASSWORD, HOME))
    assert logged_in(login("alice", ALICE_PASSWORD, ELSEWHERE))


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_LOGIN_LOCKOUT", "User")
    assert env_choice("PDSERVE_LOGIN_LOCKOUT", "user-at-address",
                      tuple(LOCKED_SCOPE)) == "user"
    monkeypatch.setenv("PDSERVE_LOGIN_LOCKOUT", "address")
    with pytest.raises(ImproperlyConfigured, match="PDSERVE_LOGIN_LOCKOUT: expected one of"):
        env_choice("PDSERVE_LOGIN_LOCKOUT", "user-at-address", tuple(LOCKED_SCOPE))
    assert settings.PDSERVE_LOGIN_LOCKOUT == "user-at-address"
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]


def test_the_lockout_expires_after_the_cool_off(owner: User, login: Login) -> None:
    fail(login, "owner", HOME, 5)
    assert locked_out(login("owner", OWNER_PASSWORD, HOME))
    # Refused attempts during the lockout do not prolong it.
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=14))
    assert locked_out(login("owner", OWNER_PASSWORD, HOME))
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=1, seconds=1))
    assert logged_in(login("owner", OWNER_PASSWORD, HOME))


def test_the_api_answers_a_lockout_in_json_and_the_page_with_a_page(owner: User) -> None:
    fail(api_login, "owner", HOME, 5)
    answer = api_login("owner", OWNER_PASSWORD, HOME)
    assert answer["Content-Type"] == "application/json"
    assert "Too many failed logins" in answer.json()["detail"] and "token" not in answer.json()
    page = page_login("owner", OWNER_PASSWORD, HOME)
    assert locked_out(page) and b'id="locked-out"' in page.content


# Transactional: the asynchronous client serves the view on another thread's connection.
@pytest.mark.django_db(transaction=True)
async def test_the_lockout_holds_under_asgi(owner: User) -> None:
    """The console runs under uvicorn: axes' middleware takes its asynchronous path there."""
    client = AsyncClient()
    form = {"username": "owner", "password": "wrong-password"}
    statuses = [(await client.post("/api/v1/auth/token/", form)).status_code for _ in range(5)]
    assert statuses == [400, 400, 400, 400, 429]
    refused = await client.post("/api/v1/auth/token/", {**form, "password": OWNER_PASSWORD})
    assert refused.status_code == 429
    assert "Too many failed logins" in refused.json()["detail"]
