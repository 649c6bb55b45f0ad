"""Changes made by the management commands name them in the audit log: ``up``'s start of the
default deployment is the command's, not a user's."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.audit.models import AuditEntry
from console.control.management.commands.up import Command as Up
from console.deployments.models import Deployment
from tests.console.tiny_models import make_plan


@pytest.mark.django_db
def test_ups_start_is_recorded_as_the_command(tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    Up().start(plan)
    assert Deployment.objects.get(pk=plan.pk).desired_state == Deployment.DesiredState.RUNNING
    entry = AuditEntry.objects.get(action="deployment.start")
    assert (entry.actor, entry.via, entry.user, entry.object_id) == (
        AuditEntry.Actor.COMMAND, "up", None, str(plan.pk))
