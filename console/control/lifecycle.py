"""Operations on deployments shared by the web views and the API.

Every way to start a deployment comes through :func:`start`, which runs the pre-flight checks
and refuses while any error stands.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from console.audit.entries import record, snapshot
from console.checks.suite import Report, run_checks
from console.control.worker_specs import chat_template_path, kv_storage_path
from console.deployments.models import Deployment
from console.deployments.plans import PlanInput, save_plan
from console.gateway.services import keys_file_path
from console.quality import services as quality
from console.rollouts import revisions
from console.supervisor.models import ManagedProcess


class Refused(Exception):
    """The checks found errors; nothing was started or saved."""

    def __init__(self, report: Report, action: str) -> None:
        super().__init__(f"{action} refused: {len(report.errors)} check(s) failed")
        self.report = report


def plan_record(deployment: Deployment) -> dict[str, Any]:
    """The plan as the audit log shows it: its fields and one line per worker slot."""
    fields = snapshot(deployment, exclude=("created", "updated", "desired_state"))
    for worker in deployment.workers.order_by("role", "index"):
        fields[f"worker {worker.slot}"] = snapshot(
            worker, exclude=("id", "deployment", "role", "index"))
    return fields


class StillRunning(Exception):
    """A deployment that runs, or has a process alive, is not deleted."""


def request_state(deployment: Deployment, desired: str) -> Deployment:
    """Record what the operator wants; the supervisor makes it so on its next tick."""
    with transaction.atomic():
        before = deployment.desired_state
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=desired)
        deployment.refresh_from_db()
        verb = "start" if desired == Deployment.DesiredState.RUNNING else "stop"
        record(f"deployment.{verb}", deployment, before={"desired_state": before},
               after={"desired_state": desired})
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
        # What starts is a revision: the plan as stored, numbered (console/rollouts).
        revisions.ensure_live(deployment)
        request_state(deployment, Deployment.DesiredState.RUNNING)
    return report


def stop(deployment: Deployment) -> Deployment:
    return request_state(deployment, Deployment.DesiredState.STOPPED)


def save(data: PlanInput, deployment: Deployment | None = None) -> tuple[Deployment, Report]:
    """Save a plan and check it. A running deployment keeps its old plan if the new one fails:
    the supervisor acts on a running plan's changes at once, so saving it is a start too."""
    with transaction.atomic():
        before = plan_record(deployment) if deployment is not None else {}
        saved = save_plan(data, deployment)
        report = run_checks(saved)
        if saved.desired_state == Deployment.DesiredState.RUNNING and not report.ok:
            raise Refused(report, "saving a running plan")
        record("deployment.create" if deployment is None else "deployment.edit", saved,
               before=before, after=plan_record(saved))
    return saved, report


def preview(data: PlanInput, deployment: Deployment | None = None) -> Report:
    """The checks of a plan as it would be saved, without saving it (the form's live table)."""
    with transaction.atomic():
        report = run_checks(save_plan(data, deployment))
        transaction.set_rollback(True)
    return report


def delete(deployment: Deployment) -> None:
    """Remove a stopped deployment: its plan, its processes' rows and logs, its router's keys
    file, its chat template file and its KV directory. Its audit entries stay (they name it,
    they do not point at it). Raises :class:`StillRunning` while it is wanted running or any
    of its processes is alive."""
    with transaction.atomic():
        # Locked, so that a start cannot slip in between the check and the delete.
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if locked.desired_state == Deployment.DesiredState.RUNNING:
            raise StillRunning(f"{locked.name} is running: stop it first")
        alive = sorted(locked.processes.filter(state__in=ManagedProcess.ALIVE_STATES)
                       .values_list("slot", flat=True))
        if alive:
            raise StillRunning(f"{locked.name} is stopping: {', '.join(alive)} still alive; "
                               "delete it once the supervisor has stopped them")
        files = [keys_file_path(locked), kv_storage_path(locked), chat_template_path(locked),
                 Path(settings.PDSERVE_LOG_DIR) / locked.name]
        record("deployment.delete", locked, before=plan_record(locked), after={})
        locked.delete()
        # Only once the rows are gone for good: a rolled-back delete keeps its files.
        transaction.on_commit(lambda: _remove(files))


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
