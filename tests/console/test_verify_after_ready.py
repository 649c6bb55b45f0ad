"""The verification after a start (console/control/verify_after_ready.py): a start of a plan
that asks for it leaves a report waiting; the supervisor's step sends it once the process table
says ready, numbered with the live revision, and the report runs to the end against the
stand-ins of tests/console/test_verification.py. A plan that does not ask gets none; a stop
before ready ends the waiting report; a verification on demand replaces it; the console's
setting is the default of new plans. The promotion's report is in
tests/console/test_rollout_runner.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.audit.models import AuditEntry
from console.control import lifecycle, verify_after_ready
from console.deployments.models import Deployment
from console.supervisor.models import ManagedProcess
from console.verification import services
from console.verification.execution import run_report
from console.verification.models import VerificationReport
from tests.console.test_verification import FAST, Stack
from tests.console.tiny_models import make_startable

pytestmark = pytest.mark.django_db

State = VerificationReport.State


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The reports handed to the Celery broker (outside this process: recorded instead)."""
    ids: list[int] = []
    monkeypatch.setattr("console.verification.services.run_verification.delay", ids.append)
    return ids


@pytest.fixture
def started(deployment: Deployment, tmp_path: Path, settings: Any,
            django_capture_on_commit_callbacks: Any) -> Iterator[Stack]:
    """``deployment`` asking for verification, started, with its processes still starting."""
    settings.PDSERVE_CACHE_DIR = tmp_path / "cache"
    make_startable(deployment)
    Deployment.objects.filter(pk=deployment.pk).update(verify_after_start=True)
    deployment.refresh_from_db()
    lifecycle.start(deployment)
    stack = Stack(deployment, tmp_path)
    ManagedProcess.objects.filter(deployment=deployment).update(
        state=ManagedProcess.State.STARTING)
    yield stack
    stack.close()


def _set_ready(deployment: Deployment) -> None:
    ManagedProcess.objects.filter(deployment=deployment).update(state=ManagedProcess.State.READY)


def test_a_start_waits_for_ready_then_sends_a_report_that_runs_to_the_end(
        started: Stack, sent: list[int], django_capture_on_commit_callbacks: Any) -> None:
    deployment = started.deployment
    report = VerificationReport.objects.get(deployment=deployment)
    assert (report.state, report.trigger) == (State.WAITING, VerificationReport.Trigger.START)
    entry = AuditEntry.objects.get(action="verification.run")
    assert entry.changes["trigger"] == [None, "start"]

    with django_capture_on_commit_callbacks(execute=True):
        assert verify_after_ready.step() is False  # still starting: nothing is sent
    assert sent == [] and VerificationReport.objects.get(pk=report.pk).state == State.WAITING

    _set_ready(deployment)
    with django_capture_on_commit_callbacks(execute=True):
        assert verify_after_ready.step() is True
    report.refresh_from_db()
    assert sent == [report.pk] and report.state == State.QUEUED
    assert report.revision == deployment.revisions.get(state="live").number
    with django_capture_on_commit_callbacks(execute=True):
        assert verify_after_ready.step() is False  # sent once

    # What the job worker then does, on a small budget here (the run itself is
    # test_verification.py's).
    VerificationReport.objects.filter(pk=report.pk).update(
        budget_s=FAST["budget_s"], options=FAST["run_options"])
    done = run_report(report.pk)
    assert done.state == State.DONE, done.error
    assert [s["name"] for s in done.sections][0] == "connectivity"


def test_a_stop_before_ready_ends_the_waiting_report(started: Stack, sent: list[int]) -> None:
    deployment = started.deployment
    lifecycle.stop(deployment)
    assert verify_after_ready.step() is True
    report = VerificationReport.objects.get(deployment=deployment)
    assert report.state == State.ERROR and "stopped before it was ready" in report.error
    assert sent == []


def test_a_verification_on_demand_replaces_the_waiting_one(started: Stack) -> None:
    deployment = started.deployment
    waiting = VerificationReport.objects.get(deployment=deployment)
    demanded = services.queue_verification(deployment, VerificationReport.Trigger.DEMAND,
                                           send=False, **FAST)
    waiting.refresh_from_db()
    assert waiting.state == State.ERROR and "on demand" in waiting.error
    assert demanded.state == State.QUEUED


def test_a_start_of_a_deployment_still_wanted_running_is_verified_too(
        deployment: Deployment, tmp_path: Path, settings: Any) -> None:
    """`make up` after a console's stop: the plan is still wanted running, its workers start
    afresh."""
    settings.PDSERVE_CACHE_DIR = tmp_path / "cache"
    make_startable(deployment)
    Deployment.objects.filter(pk=deployment.pk).update(
        verify_after_start=True, desired_state=Deployment.DesiredState.RUNNING)
    deployment.refresh_from_db()
    lifecycle.start(deployment)
    report = VerificationReport.objects.get(deployment=deployment)
    assert (report.state, report.trigger) == (State.WAITING, VerificationReport.Trigger.START)


def test_a_plan_that_does_not_ask_is_not_verified(deployment: Deployment) -> None:
    assert deployment.verify_after_start is False  # the suite's setting (tests/conftest.py)
    lifecycle.start(make_startable(deployment))
    assert not VerificationReport.objects.filter(deployment=deployment).exists()


def test_the_consoles_setting_is_the_default_of_new_plans(settings: Any) -> None:
    settings.PDSERVE_VERIFY_AFTER_START = True
    assert Deployment().verify_after_start is True
    settings.PDSERVE_VERIFY_AFTER_START = False
    assert Deployment().verify_after_start is False
