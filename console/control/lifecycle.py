"""Operations on deployments shared by the web views and the API.

Every way to start a deployment comes through :func:`start`, which runs the pre-flight checks
and refuses while any error stands.
"""

from __future__ import annotations

from django.db import transaction

from console.checks.suite import Report, run_checks
from console.deployments.models import Deployment
from console.deployments.plans import PlanInput, save_plan
from console.quality import services as quality


class Refused(Exception):
    """The checks found errors; nothing was started or saved."""

    def __init__(self, report: Report, action: str) -> None:
        super().__init__(f"{action} refused: {len(report.errors)} check(s) failed")
        self.report = report


def request_state(deployment: Deployment, desired: str) -> Deployment:
    """Record what the operator wants; the supervisor makes it so on its next tick."""
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=desired)
    deployment.refresh_from_db()
    return deployment


def check(deployment: Deployment) -> Report:
    return run_checks(deployment)


def start(deployment: Deployment) -> Report:
    """Start the deployment unless a check fails; raises :class:`Refused` then."""
    report = run_checks(deployment)
    if not report.ok:
        raise Refused(report, "start")
    with transaction.atomic():
        if deployment.desired_state != Deployment.DesiredState.RUNNING:
            # The supervisor starts the router only once this gate is done (console/quality).
            quality.on_start(deployment)
        request_state(deployment, Deployment.DesiredState.RUNNING)
    return report


def stop(deployment: Deployment) -> Deployment:
    return request_state(deployment, Deployment.DesiredState.STOPPED)


def save(data: PlanInput, deployment: Deployment | None = None) -> tuple[Deployment, Report]:
    """Save a plan and check it. A running deployment keeps its old plan if the new one fails:
    the supervisor acts on a running plan's changes at once, so saving it is a start too."""
    with transaction.atomic():
        saved = save_plan(data, deployment)
        report = run_checks(saved)
        if saved.desired_state == Deployment.DesiredState.RUNNING and not report.ok:
            raise Refused(report, "saving a running plan")
    return saved, report


def preview(data: PlanInput, deployment: Deployment | None = None) -> Report:
    """The checks of a plan as it would be saved, without saving it (the form's live table)."""
    with transaction.atomic():
        report = run_checks(save_plan(data, deployment))
        transaction.set_rollback(True)
    return report
