"""Operations on deployments shared by the web views and the API.

Every way to start a deployment comes through :func:`start`, which runs the pre-flight checks
and refuses while any error stands.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any, NoReturn

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from kombu.exceptions import OperationalError

from console.audit.entries import record, snapshot
from console.catalog.models import Variant
from console.checks.suite import Report, run_checks
from console.control.agent_tasks import notify_agents
from console.control.kv_storage import remove_deployment_kv_dirs
from console.control.worker_specs import chat_template_path
from console.deployments.engine_args import FIELD, check_engine_args
from console.deployments.models import Deployment
from console.deployments.plans import PlanInput, PoolInput, plan_transaction, save_plan
from console.fleet.services import local_node
from console.gateway.services import keys_file_path
from console.quality import services as quality
from console.rollouts import revisions
from console.rollouts.models import Revision
from console.supervisor.models import ManagedProcess
from console.verification import services as verification
from console.verification.models import VerificationReport

log = logging.getLogger("pdserve.control")


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
        # The agents of the nodes it runs on act at once rather than at their next tick.
        transaction.on_commit(lambda: _tell_agents(deployment, verb))
    return deployment


def _tell_agents(deployment: Deployment, action: str) -> None:
    try:
        notify_agents(deployment, action)
    except OperationalError as exc:
        # The plan is stored; each agent acts on it at its next tick all the same.
        log.warning("%s %s: could not message the node agents (%s); they act at their next "
                    "tick", action, deployment.name, exc)


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
        # Verified once it is ready, when the plan asks for it: after `make up` too, which
        # starts a deployment still wanted running from the console's last run afresh.
        verification.after_ready(deployment, VerificationReport.Trigger.START)
        # What starts is a revision: the plan as stored, numbered (console/rollouts).
        revisions.ensure_live(deployment)
        request_state(deployment, Deployment.DesiredState.RUNNING)
    return report


def stop(deployment: Deployment) -> Deployment:
    return request_state(deployment, Deployment.DesiredState.STOPPED)


class DraftMade(Exception):
    """A running deployment's plan edit changed revision fields or variants: nothing of them
    was saved, a draft revision holds them instead (roll it out to change the workers). The
    edit's live part (instances, devices, ports, router settings) was applied when
    ``live_edits`` is true."""

    def __init__(self, revision: Revision, changes: dict[str, list[Any]], report: Report,
                 live_edits: bool) -> None:
        super().__init__(f"draft r{revision.number} made: {', '.join(changes)}")
        self.revision = revision
        self.changes = changes
        self.report = report
        self.live_edits = live_edits


class _RevisionChange(Exception):
    """Internal: the saved plan is another revision than the live one (rolls the save back)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__("the plan edit changes the revision")
        self.spec = spec


def save(data: PlanInput, deployment: Deployment | None = None,
         user: AbstractBaseUser | None = None) -> tuple[Deployment, Report]:
    """Save a plan and check it. A running deployment keeps its old plan if the new one fails:
    the supervisor acts on a running plan's changes at once, so saving it is a start too.

    A running deployment's workers are its live revision: an edit that changes a revision field
    or a role's variant saves none of that and raises :class:`DraftMade` with a draft revision
    holding it (the edit's live part, if any, is applied). A stopped plan is edited in place.

    Extra engine flags that change need their role of ``user`` (None: a management command)."""
    if FIELD in data.fields:
        _check_engine_args(data, deployment, user)
    live = _running_revision(deployment)
    try:
        with plan_transaction(data, deployment):
            before = plan_record(deployment) if deployment is not None else {}
            saved = save_plan(data, deployment)
            if live is not None:
                spec = revisions.snapshot(saved)
                if revisions.identity(spec) != revisions.identity(live.spec):
                    raise _RevisionChange(spec)
            report = run_checks(saved)
            if saved.desired_state == Deployment.DesiredState.RUNNING and not report.ok:
                raise Refused(report, "saving a running plan")
            record("deployment.create" if deployment is None else "deployment.edit", saved,
                   before=before, after=plan_record(saved))
    except _RevisionChange as change:
        assert deployment is not None and live is not None
        deployment.refresh_from_db()  # save_plan set the edit's values on it
        _draft(data, deployment, live, change.spec, user)
    return saved, report


def _check_engine_args(data: PlanInput, deployment: Deployment | None,
                       user: AbstractBaseUser | None) -> None:
    """The plan's extra engine flags against the stored ones: a flag that changes needs its
    role in the team the plan is in (or goes to)."""
    stored = (Deployment.objects.filter(pk=deployment.pk).values_list(FIELD, flat=True).first()
              if deployment is not None and deployment.pk else None)
    team = data.fields.get("team")
    team_id = team.pk if team is not None else deployment.team_id if deployment else None
    check_engine_args(data.fields[FIELD], user, team_id, before=stored or [])


def _running_revision(deployment: Deployment | None) -> Revision | None:
    """The live revision of a deployment wanted running, as its plan is stored; None for a
    stopped or new one, or one never started since revisions exist."""
    if deployment is None or deployment.pk is None:
        return None
    # As stored: a form's validation has already set the edit's values on ``deployment``.
    stored = Deployment.objects.filter(pk=deployment.pk).first()
    if stored is None or stored.desired_state != Deployment.DesiredState.RUNNING:
        return None
    live = revisions.live(stored)
    if live is not None and (revisions.identity(revisions.snapshot(stored))
                             != revisions.identity(live.spec)):
        # The running plan is not the live revision (edited in place before edits of a
        # running plan became drafts): the workers run the plan, so it becomes the revision.
        live = revisions.ensure_live(stored)
    return live


def _draft(data: PlanInput, deployment: Deployment, live: Revision, spec: dict[str, Any],
           user: AbstractBaseUser | None) -> NoReturn:
    """Apply the edit's live part (the plan with the live revision's fields and variants) and
    make a draft of the rest, in one transaction; raises :class:`DraftMade`, or Refused or
    ValidationError with nothing saved."""
    fields = {name: spec[name] for name in revisions.FIELDS if spec[name] != live.spec[name]}
    mode_changed = "mode" in fields
    variants: dict[str, Variant] = {}
    for role, pool in spec["pools"].items():
        was = live.spec["pools"].get(role)
        if mode_changed or was is None or was["variant"] != pool["variant"]:
            variants[role] = Variant.objects.get(pk=pool["variant"])
    restored = PlanInput(fields={**data.fields, **{name: live.spec[name] for name in fields}},
                         partial=data.partial)
    if mode_changed:
        _check_new_roles(spec, live)
        # The request's pools are the new mode's: the plan keeps its own.
        restored.partial, restored.pools = True, {}
    else:
        kept = {v.pk: v for v in Variant.objects.filter(
            pk__in=[p["variant"] for p in live.spec["pools"].values()])}
        restored.pools = {role: PoolInput(
            variant=kept[live.spec["pools"][role]["variant"]] if role in variants
            else pool.variant, instances=pool.instances) for role, pool in data.pools.items()}
    with plan_transaction(restored, deployment):
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        before = plan_record(locked)
        with transaction.atomic():
            saved = save_plan(restored, locked)
            after = plan_record(saved)
            live_edits = after != before
            if not live_edits:  # the rows save_plan rewrote as they were: leave them alone
                transaction.set_rollback(True)
        if live_edits:
            checks = run_checks(saved)
            if not checks.ok:
                raise Refused(checks, "saving a running plan")
            record("deployment.edit", saved, before=before, after=after)
        fresh = Deployment.objects.get(pk=deployment.pk)
        revision, report = revisions.create_draft(fresh, fields, variants, user,
                                                  note="from a plan edit of the running "
                                                       "deployment")
        base = revisions.live(fresh)
        changes = revisions.diff(base.spec if base else None, revision.spec)
    raise DraftMade(revision, changes, report, live_edits)


def _check_new_roles(spec: dict[str, Any], live: Revision) -> None:
    """A draft gives a role the live revision lacks one instance on this machine, its devices
    and ports chosen when it rolls out: a mode change that asks for more is refused."""
    local = local_node().pk
    errors = {role: (f"a mode change makes a draft revision with one {role} instance on this "
                     f"machine; change the mode alone, and the instances once it is live")
              for role, pool in spec["pools"].items() if role not in live.spec["pools"]
              and (len(pool["instances"]) != 1
                   or pool["instances"][0]["node"] not in (None, local))}
    if errors:
        raise ValidationError(errors)


def preview(data: PlanInput, deployment: Deployment | None = None) -> Report:
    """The checks of a plan as it would be saved, without saving it (the form's live table)."""
    with plan_transaction(data, deployment):
        report = run_checks(save_plan(data, deployment))
        transaction.set_rollback(True)
    return report


def delete(deployment: Deployment) -> None:
    """Remove a stopped deployment: its plan, its processes' rows and logs, its router's keys
    file, its chat template file and its revisions' KV directories. Its audit entries stay (they name it,
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
        files = [keys_file_path(locked), chat_template_path(locked),
                 Path(settings.PDSERVE_LOG_DIR) / locked.name]
        name = locked.name
        record("deployment.delete", locked, before=plan_record(locked), after={})
        locked.delete()
        # Only once the rows are gone for good: a rolled-back delete keeps its files. The KV
        # directories: every revision's, each only once checked to be inside the KV root.
        transaction.on_commit(lambda: _remove(files))
        transaction.on_commit(lambda: remove_deployment_kv_dirs(name))


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
