"""Members of the default team in each role, and a stranger who operates another team: the
owner / teammate / outsider users of the permission tests."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.accounts.models import Membership, Role, Team
from console.accounts.roles import default_team
from console.audit.models import AuditEntry
from tests.console.tokens import token_for


@dataclass(frozen=True)
class Crew:
    team: Team
    viewer: User
    operator: User
    admin: User
    stranger: User  # operator of another team: sees nothing of this one


def member(name: str, team: Team, role: Role) -> User:
    user = User.objects.create_user(username=name, password=f"{name}-pass-123")
    Membership.objects.create(team=team, user=user, role=role)
    return user


def make_crew() -> Crew:
    """Each test file's ``crew`` fixture (a fixture imported into a module reads as unused)."""
    team = default_team()
    other = Team.objects.create(name="elsewhere")
    return Crew(team=team, viewer=member("vera", team, Role.VIEWER),
                operator=member("otto", team, Role.OPERATOR),
                admin=member("ada", team, Role.ADMIN),
                stranger=member("stan", other, Role.OPERATOR))


def token_client(team: Team, role: Role | None, name: str) -> Client:
    """A client that sends a new user's API token; with ``role``, the user is of ``team``."""
    user = User.objects.create_user(name, "", "pw")
    if role is not None:
        Membership.objects.create(team=team, user=user, role=role)
    return Client(headers={"Authorization": f"Token {token_for(user)}"})


def api_as(user: User | None) -> APIClient:
    """An API client signed in as ``user`` (anonymous for None)."""
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def actions(prefix: str = "") -> list[tuple[str, str]]:
    """(action, username) of the audit entries so far whose action starts with ``prefix``,
    oldest first."""
    return [(e.action, e.username) for e in
            AuditEntry.objects.filter(action__startswith=prefix).order_by("pk")]
