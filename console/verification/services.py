"""Queueing a verification (button, API, command), and what a rollout may ask of one."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from console.audit.entries import record
from console.deployments.models import Deployment
from console.verification.execution import run_verification
from console.verification.models import VerificationReport
from console.verification.stress import DEFAULT_HOLD_S
from console.verification.subject import live_revision
from console.verification.sweep import SweepSize

State = VerificationReport.State
DEFAULT_BUDGET_S = 300
DEFAULT_STRESS_S = DEFAULT_HOLD_S
# Beyond its budget, how long a report may stay queued or running before it is taken as lost.
STALE_AFTER_S = 600


class VerificationRefused(Exception):
    """A verification that cannot run now; the message says why."""


def options(lengths: int = SweepSize.lengths, concurrencies: int = SweepSize.concurrencies,
            stress_s: int = DEFAULT_STRESS_S) -> dict[str, Any]:
    return {"lengths": lengths, "concurrencies": concurrencies, "stress_s": stress_s}


@transaction.atomic
def queue_verification(deployment: Deployment, trigger: str, *, budget_s: int = DEFAULT_BUDGET_S,
                       run_options: dict[str, Any] | None = None,
                       user: AbstractBaseUser | AnonymousUser | None = None,
                       send: bool = True) -> VerificationReport:
    """A new report of the running deployment, audited; ``send``: run it as a Celery task once
    the transaction commits (the command runs it itself)."""
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        raise VerificationRefused("the deployment is not running: a verification measures its "
                                  "running processes")
    _expire_stale(deployment)
    if deployment.verifications.filter(state__in=(State.QUEUED, State.RUNNING)).exists():
        raise VerificationRefused("a verification of this deployment is already queued or running")
    report = VerificationReport.objects.create(
        deployment=deployment, trigger=trigger, budget_s=budget_s,
        revision=live_revision(deployment), options=run_options or options(),
        requested_by=user if user is not None and user.is_authenticated else None)
    record("verification.run", report, team_id=deployment.team_id, after={
        "deployment": deployment.name, "revision": report.revision, "budget_s": budget_s,
        "options": report.options, "trigger": trigger})
    if send:
        transaction.on_commit(partial(_send, report.pk))
    return report


def _expire_stale(deployment: Deployment) -> int:
    """End the reports whose job never finished (its Celery worker was killed, or never took
    it): each would otherwise block every later verification of the deployment."""
    stale = 0
    for report in deployment.verifications.filter(state__in=(State.QUEUED, State.RUNNING)):
        if timezone.now() - report.created > timedelta(seconds=report.budget_s + STALE_AFTER_S):
            stale += VerificationReport.objects.filter(pk=report.pk, state=report.state).update(
                state=State.ERROR, finished_at=timezone.now(),
                error="it never finished: its job worker stopped or never took it")
    return stale


def _send(report_id: int) -> None:
    try:
        run_verification.delay(report_id)
    except Exception as exc:  # a broker that cannot be reached must not leave the row queued
        VerificationReport.objects.filter(pk=report_id).update(
            state=State.ERROR, error=f"could not queue the job: {exc}"[:1000],
            finished_at=timezone.now())


def passing_report(deployment: Deployment, revision: int | None = None) -> VerificationReport | None:
    """The hook a rollout may call before promoting green: the latest finished report of the
    deployment (of ``revision`` when given) if it passed (no failing section), else None. Not
    wired into rollouts yet."""
    reports = deployment.verifications.filter(state=State.DONE)
    if revision is not None:
        reports = reports.filter(revision=revision)
    latest = reports.order_by("-pk").first()
    return latest if latest is not None and latest.passing else None
