"""Whose processes are whose: a deployment's belong to its team; a process of no deployment (a
builder, a measurement's server, a gate's reference) serves the shared catalog or several
teams, and is a superuser's to see."""

from __future__ import annotations

from django.db.models import QuerySet

from console.accounts.roles import User, visible
from console.supervisor.models import ManagedProcess


def visible_processes(rows: QuerySet[ManagedProcess], user: User) -> QuerySet[ManagedProcess]:
    # A non-superuser's filter on the deployment's team leaves out the rows of no deployment.
    return visible(rows, user, team_field="deployment__team")


def team_of(process: ManagedProcess) -> int | None:
    return process.deployment.team_id if process.deployment_id is not None else None
