"""The advice's one click: a draft revision of the recommended topology, rolled out with the
rollout machinery (console/rollouts), both or neither.

A revision holds the mode and each role's variant; a role the live plan already has keeps its
instances (their count is a live edit, the autoscaler's), so only a switch between colocated
and PD is a revision. The new roles get the recommended number of instances, placed by the
plan's checks as a new plan's are."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from console.audit.entries import record
from console.deployments.models import Deployment
from console.rollouts import revisions, services
from console.rollouts.models import Revision, Rollout

BLANK_INSTANCE = {"node": None, "cpu_cores": "", "gpu_indices": "", "share_devices": False}


class ApplyRefused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def target_pools(servers: dict[str, int], variant_pk: int, variant_name: str) -> dict[str, Any]:
    return {role: {"variant": variant_pk, "variant_name": variant_name,
                   "instances": [dict(BLANK_INSTANCE) for _ in range(count)]}
            for role, count in servers.items() if count}


def apply(deployment: Deployment, advice: dict[str, Any], user: AbstractBaseUser | None,
          strategy: str = "blue_green") -> tuple[Revision, Rollout]:
    """Draft and start rolling out ``advice``'s recommended topology (predictions.advise)."""
    if advice.get("status") != "advised":
        raise ApplyRefused("advice", advice.get("detail", "there is no advice to apply"))
    best = advice["candidates"][0]
    if best["current"]:
        raise ApplyRefused("advice", f"{best['topology']} is the current plan already")
    if best["mode"] == deployment.mode:
        raise ApplyRefused("advice", f"{best['topology']} keeps the {deployment.mode} mode: its "
                                     "server counts are a live edit of the plan (or the "
                                     "autoscaler's), not a revision")
    measured = deployment.workers.filter(role__in=("decode", "colocated")).select_related(
        "variant").first() or deployment.workers.select_related("variant").first()
    if measured is None:
        raise ApplyRefused("advice", "the plan has no workers")
    with transaction.atomic():
        base = revisions.ensure_live(deployment)
        spec = {**base.spec, "mode": best["mode"],
                "pools": target_pools(best["servers"], measured.variant.pk, str(measured.variant))}
        try:
            report = revisions.check_spec(deployment, spec)
        except ValidationError as exc:
            raise ApplyRefused("advice", f"the recommended plan is invalid: {exc}") from exc
        if not report.ok:
            errors = "; ".join(f"{o.id}: {o.message}" for o in report.errors)
            raise ApplyRefused("advice", f"the recommended plan fails its checks: {errors}")
        number = (deployment.revisions.aggregate(top=Max("number"))["top"] or 0) + 1
        revision = Revision.objects.create(
            deployment=deployment, number=number, spec=spec, state=Revision.State.DRAFT,
            note=f"advisor: {best['topology']}, predicted {best['goodput_rps']} req/s within "
                 f"the SLOs for {advice['load']}", created_by=user)
        record("revision.create", revision, team_id=deployment.team_id, after={
            "deployment": deployment.name, "number": revision.number, "state": revision.state,
            "changes": revisions.diff(base.spec, spec), "advised": best["topology"]})
        try:
            rollout = services.start(deployment, revision, strategy, user)
        except services.RolloutRefused as exc:
            # Raised inside the transaction: the draft goes too, one click makes both or neither.
            field = "strategy" if exc.field == "strategy" else "advice"
            raise ApplyRefused(field, str(exc)) from exc
    return revision, rollout
