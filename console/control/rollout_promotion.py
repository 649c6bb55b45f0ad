"""A rollout's promotion (console/control/rollout_runner.py's draining state, once blue has
drained): the plan becomes green's revision on green's ports, the process table's slots are
swapped so that the supervisor keeps green's workers as the plan's and stops blue's (renamed
``slot@rN-retired``), and the revisions change state, in one transaction.

What the plan's validation imports (vLLM's parser, for green's engine flags) is loaded before
that transaction: under a canary's load the import took over two minutes inside it, holding
SQLite's write lock while every other writer failed "database is locked"."""

from __future__ import annotations

from console.control.worker_specs import retired_slot
from console.deployments.models import Deployment
from console.deployments.plans import plan_transaction, save_plan
from console.rollouts import revisions
from console.rollouts.machine import move
from console.rollouts.models import Revision, Rollout
from console.supervisor.engine import Child
from console.supervisor.models import ManagedProcess
from console.verification import services as verification
from console.verification.models import VerificationReport

State = Rollout.State


def promote(rollout: Rollout, children: dict[int, Child]) -> None:
    """The plan becomes green's revision, on green's ports; the processes' slots follow, so
    that the supervisor keeps green's workers as the plan's and stops blue's."""
    deployment = Deployment.objects.get(pk=rollout.deployment_id)
    renames: dict[int, str] = {}
    data = revisions.plan_input(rollout.green.spec,
                                revisions.layout(deployment, rollout.green.spec))
    with plan_transaction(data, deployment):
        for role, pool in data.pools.items():
            for index, instance in enumerate(pool.instances):
                ports = rollout.green_ports[f"{role}-{index}"]
                instance.port = ports["port"]
                instance.side_channel_port = ports["side_channel_port"]
        save_plan(data, deployment)
        processes = ManagedProcess.objects.filter(deployment=deployment,
                                                  kind=ManagedProcess.Kind.WORKER)
        blue_slots = [p for p in processes if "@" not in p.slot]
        green_suffix = f"@r{rollout.green.number}"
        green_rows = [p for p in processes if p.slot.endswith(green_suffix)]
        # Rows a slot will be renamed to that are left from earlier rollouts (stopped).
        taken = {retired_slot(p.slot, rollout.blue) for p in blue_slots}
        processes.filter(slot__in=taken).exclude(
            state__in=ManagedProcess.ALIVE_STATES).delete()
        for row in blue_slots:
            renames[row.pk] = retired_slot(row.slot, rollout.blue)
        for row in green_rows:
            renames[row.pk] = row.slot.removesuffix(green_suffix)
        for pk in renames:  # two passes: no new name meets an old one in the constraint
            ManagedProcess.objects.filter(pk=pk).update(slot=f"~{pk}")
        for pk, slot in renames.items():
            ManagedProcess.objects.filter(pk=pk).update(slot=slot)
        Revision.objects.filter(pk=rollout.blue.pk).update(state=Revision.State.RETIRED)
        Revision.objects.filter(pk=rollout.green.pk).update(state=Revision.State.LIVE)
        move(rollout, State.SUCCEEDED, f"r{rollout.green.number} is live; blue "
             f"r{rollout.blue.number}'s workers stop")
    for pk, slot in renames.items():
        if pk in children:
            children[pk].slot = slot
    # Green is the deployment now: verified once it is ready, when the plan asks for it.
    deployment.refresh_from_db()
    verification.after_ready(deployment, VerificationReport.Trigger.PROMOTION)
