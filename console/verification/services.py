"""Queueing a verification (button, API, command), and what a rollout may ask of one."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from console.audit.entries import record
from console.celery import queue_or_mark
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
# One report at a time per deployment is queued or runs (a waiting one is replaced instead).
ACTIVE = (State.QUEUED, State.RUNNING)


class VerificationRefused(Exception):
    """A verification that cannot run now; the message says why."""


def options(lengths: int = SweepSize.lengths, concurrencies: int = SweepSize.concurrencies,
            stress_s: int = DEFAULT_STRESS_S) -> dict[str, Any]:
    return {"lengths": lengths, "concurrencies": concurrencies, "stress_s": stress_s}


@transaction.atomic
def queue_verification(deployment: Deployment, trigger: str, *, budget_s: int = DEFAULT_BUDGET_S,
                       run_options: dict[str, Any] | None = None,
                       user: AbstractBaseUser | AnonymousUser | None = None,
                       send: bool = True, revision: int | None = None) -> VerificationReport:
    """A new report of the running deployment, audited; ``send``: run it as a Celery task once
    the transaction commits (the command runs it itself). ``revision``: the revision measured,
    when it is not the live one (a rollout's green, trigger ``green``)."""
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        raise VerificationRefused("the deployment is not running: a verification measures its "
                                  "running processes")
    _expire_stale(deployment)
    if deployment.verifications.filter(state__in=ACTIVE).exists():
        raise VerificationRefused("a verification of this deployment is already queued or running")
    _replace_waiting(deployment, "replaced by a verification on demand" if revision is None
                     else f"replaced by the verification of green r{revision}")
    report = VerificationReport.objects.create(
        deployment=deployment, trigger=trigger, budget_s=budget_s,
        revision=live_revision(deployment) if revision is None else revision,
        options=run_options or options(),
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
    for report in deployment.verifications.filter(state__in=ACTIVE):  # a waiting one has no job
        if timezone.now() - report.created > timedelta(seconds=report.budget_s + STALE_AFTER_S):
            stale += VerificationReport.objects.filter(pk=report.pk, state=report.state).update(
                state=State.ERROR, finished_at=timezone.now(),
                error="it never finished: its job worker stopped or never took it")
    return stale


def after_ready(deployment: Deployment, trigger: str) -> VerificationReport | None:
    """Called by every start and every promotion: when the plan wants it, a report that waits
    for the deployment to be ready (``send_when_ready``). One replaces a report still waiting
    from an earlier start; one queued or running goes on and this start adds none."""
    if not deployment.verify_after_start:
        return None
    _replace_waiting(deployment, f"replaced: a {trigger} came before the deployment was ready")
    _expire_stale(deployment)
    if deployment.verifications.filter(state__in=ACTIVE).exists():
        return None
    report = VerificationReport.objects.create(
        deployment=deployment, trigger=trigger, state=State.WAITING, budget_s=DEFAULT_BUDGET_S,
        options=options())
    record("verification.run", report, team_id=deployment.team_id, after={
        "deployment": deployment.name, "budget_s": report.budget_s, "options": report.options,
        "trigger": trigger, "state": report.state})
    return report


def _replace_waiting(deployment: Deployment, why: str) -> None:
    deployment.verifications.filter(state=State.WAITING).update(
        state=State.ERROR, finished_at=timezone.now(), error=why)


def send_when_ready(report: VerificationReport, ready: bool) -> bool:
    """A waiting report: queued and sent once its deployment is ready, numbered with the
    revision live then; ended when the deployment was stopped first. True when it moved."""
    deployment = report.deployment
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        return VerificationReport.objects.filter(pk=report.pk, state=State.WAITING).update(
            state=State.ERROR, finished_at=timezone.now(),
            error="the deployment was stopped before it was ready") > 0
    if not ready:
        return False
    with transaction.atomic():
        moved = VerificationReport.objects.filter(pk=report.pk, state=State.WAITING).update(
            state=State.QUEUED, revision=live_revision(deployment))
        if moved:
            transaction.on_commit(partial(_send, report.pk))
    return moved > 0


def _send(report_id: int) -> None:
    queue_or_mark(run_verification, report_id, VerificationReport.objects.all(),
                  state=State.ERROR, finished_at=timezone.now())
