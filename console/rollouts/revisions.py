"""Revisions: what a snapshot holds, how two differ, drafts, and making one the plan.

A revision holds every setting that changes what the workers compute or how they are laid out:
the mode, the variant of each role, the engine and KV settings, sampling defaults, extra engine
flags, tool calling and the chat template, the images a prompt may carry, and the output gate's
thresholds. Instance counts, devices, ports and router policies are not in it: they stay live
edits of the plan.
"""

from __future__ import annotations

import copy
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from console.audit.entries import record
from console.catalog.models import Variant
from console.checks.suite import Report, run_checks
from console.deployments.engine_args import check_engine_args
from console.deployments.models import Deployment, WorkerPlan
from console.deployments.plans import (
    POOL_ROLES,
    InstanceInput,
    PlanInput,
    PoolInput,
    plan_transaction,
    save_plan,
    stored_pools,
)
from console.fleet.services import local_node
from console.rollouts.models import Revision

# The router renders chat prompts with one template and checks lengths with one context length
# for all its revision groups, so the chat template, the tool parsers (which go with it) and
# max_model_len stay plan edits applied to every revision: a revision that changed them would
# have its PD hand-offs rendered with the other revision's template. What a failed gate does to
# traffic (gate_action, block or warn) is a live edit too, like the router's policies.
# max_images_per_prompt is the workers' --limit-mm-per-prompt, so a revision carries it (the
# router's count follows the plan, and the plan takes the revision's at promotion); the other
# image limits and sources (max_image_bytes, max_image_pixels, media_paths, media_domains) are
# the router's alone and stay live edits, like its policies.
FIELDS: tuple[str, ...] = (
    "mode", "engine_version", "dtype", "kv_channel", "block_size", "kv_cache_dtype",
    "kv_cache_gib", "kv_load_failure", "sampling_defaults", "extra_engine_args",
    "max_images_per_prompt",
    "gate_mode", "gate_prompts", "gate_min_agreement", "gate_max_mean_delta",
)


def snapshot(deployment: Deployment) -> dict[str, Any]:
    """The deployment's revision fields as stored now, and each role's variant and layout."""
    spec: dict[str, Any] = {name: getattr(deployment, name) for name in FIELDS}
    pools: dict[str, Any] = {}
    for role, pool in stored_pools(deployment).items():
        pools[role] = {
            "variant": pool.variant.pk, "variant_name": str(pool.variant),
            "instances": [{"node": i.node.pk if i.node else None, "cpu_cores": i.cpu_cores or "",
                           "gpu_indices": i.gpu_indices or "", "share_devices": i.share_devices}
                          for i in pool.instances],
        }
    spec["pools"] = pools
    return spec


def identity(spec: dict[str, Any]) -> dict[str, Any]:
    """What two revisions must share to be the same: the layout of instances is a live edit."""
    same = {name: spec.get(name) for name in FIELDS}
    same["variants"] = {role: pool["variant"] for role, pool in spec["pools"].items()}
    return same


def diff(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, list[Any]]:
    """{field: [before, after]} of what changes what the workers compute; a role's variant is
    ``variant.<role>`` and named as the catalog names it."""
    old = _comparable(before) if before is not None else {}
    new = _comparable(after)
    return {key: [old.get(key), new.get(key)] for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)}


def _comparable(spec: dict[str, Any]) -> dict[str, Any]:
    flat = {name: spec.get(name) for name in FIELDS}
    for role, pool in spec["pools"].items():
        flat[f"variant.{role}"] = pool["variant_name"]
    return flat


def live(deployment: Deployment) -> Revision | None:
    return deployment.revisions.filter(state=Revision.State.LIVE).first()


def live_number(deployment: Deployment) -> int | None:
    """The live revision's number; None for a deployment never started since revisions exist."""
    return (Revision.objects.filter(deployment=deployment, state=Revision.State.LIVE)
            .values_list("number", flat=True).first())


def _next_number(deployment: Deployment) -> int:
    return (deployment.revisions.aggregate(top=Max("number"))["top"] or 0) + 1


@transaction.atomic
def ensure_live(deployment: Deployment) -> Revision:
    """The live revision, made from the plan as stored when there is none or the plan no longer
    matches it (a stopped deployment's plan is edited in place: its next start is a revision)."""
    Deployment.objects.select_for_update().filter(pk=deployment.pk).first()
    current = live(deployment)
    spec = snapshot(deployment)
    if current is not None and identity(current.spec) == identity(spec):
        if current.spec != spec:  # only the layout moved: the same revision, as laid out now
            Revision.objects.filter(pk=current.pk).update(spec=spec)
            current.spec = spec
        return current
    if current is not None:
        Revision.objects.filter(pk=current.pk).update(state=Revision.State.RETIRED)
    revision = Revision.objects.create(deployment=deployment, number=_next_number(deployment),
                                       spec=spec, state=Revision.State.LIVE,
                                       note="the plan as started")
    record("revision.create", revision, team_id=deployment.team_id, after={
        "deployment": deployment.name, "number": revision.number, "state": revision.state,
        "changes": diff(current.spec if current else None, spec)})
    return revision


def plan_input(spec: dict[str, Any], instances: dict[str, list[InstanceInput]]) -> PlanInput:
    """The plan writer's input for ``spec`` laid out as ``instances`` (role -> instances)."""
    variants = {v.pk: v for v in Variant.objects.filter(
        pk__in=[pool["variant"] for pool in spec["pools"].values()])}
    missing = [pool["variant_name"] for pool in spec["pools"].values()
               if pool["variant"] not in variants]
    if missing:
        raise ValidationError({"variant": f"variant {', '.join(missing)} no longer exists"})
    pools = {role: PoolInput(variant=variants[pool["variant"]], instances=instances[role])
             for role, pool in spec["pools"].items()}
    return PlanInput(fields={name: spec[name] for name in FIELDS}, pools=pools)


def layout(deployment: Deployment, spec: dict[str, Any]) -> dict[str, list[InstanceInput]]:
    """Where ``spec``'s instances run: a role the plan has keeps the plan's instances (their
    count and devices are live edits); a role it lacks (a topology switch) takes the spec's.
    Ports are left out: they are chosen for each rollout."""
    current = stored_pools(deployment)
    placed: dict[str, list[InstanceInput]] = {}
    for role, pool in spec["pools"].items():
        if role in current:
            placed[role] = [InstanceInput(node=i.node, cpu_cores=i.cpu_cores,
                                          gpu_indices=i.gpu_indices,
                                          share_devices=i.share_devices)
                            for i in current[role].instances]
        else:
            placed[role] = [InstanceInput(cpu_cores=i["cpu_cores"] or None,
                                          gpu_indices=i["gpu_indices"] or None,
                                          share_devices=i["share_devices"])
                            for i in pool["instances"]]
    return placed


def shadow_workers(deployment: Deployment, spec: dict[str, Any]) -> list[WorkerPlan]:
    """``spec``'s workers laid out as the plan lays its roles out, unsaved and without ports, on
    a copy of the deployment that carries the spec's settings (what launching and the memory
    estimate read)."""
    shadow = copy.copy(deployment)
    for name in FIELDS:
        setattr(shadow, name, spec[name])
    variants = {v.pk: v for v in Variant.objects.filter(
        pk__in=[pool["variant"] for pool in spec["pools"].values()])}
    workers = []
    for role, instances in layout(deployment, spec).items():
        for index, instance in enumerate(instances):
            node = instance.node or local_node()
            workers.append(WorkerPlan(
                deployment=shadow, role=role, index=index,
                variant=variants[spec["pools"][role]["variant"]], node=node,
                host="127.0.0.1" if node.is_local else node.address,
                cpu_cores=instance.cpu_cores or "", gpu_indices=instance.gpu_indices or "",
                share_devices=instance.share_devices))
    return workers


def create_draft(deployment: Deployment, fields: dict[str, Any], variants: dict[str, Variant],
                 user: AbstractBaseUser | None, note: str = "") -> tuple[Revision, Report]:
    """A draft revision: the live one with ``fields`` (model field names) and ``variants`` (role
    -> variant; a new mode needs its roles) changed. It is checked as the plan would be, with
    the plan's own validation and pre-flight checks, and nothing of the plan is changed.
    Raises ValidationError (keyed by field) when it is invalid or changes nothing."""
    unknown = sorted(set(fields) - set(FIELDS) - {"mode"})
    if unknown:
        raise ValidationError({name: "not a revision field" for name in unknown})
    base = ensure_live(deployment)
    if "extra_engine_args" in fields:
        # Only the flags that differ from the live revision's need the user's role.
        check_engine_args(fields["extra_engine_args"], user, deployment.team_id,
                          before=base.spec.get("extra_engine_args") or [])
    spec = {**base.spec, **fields}
    roles = POOL_ROLES[Deployment.Mode(spec["mode"])]
    pools: dict[str, Any] = {}
    for role in roles:
        if role in variants:
            variant = variants[role]
            previous = base.spec["pools"].get(role)
            pools[role] = {"variant": variant.pk, "variant_name": str(variant),
                           "instances": previous["instances"] if previous else [
                               {"node": None, "cpu_cores": "", "gpu_indices": "",
                                "share_devices": False}]}
        elif role in base.spec["pools"]:
            pools[role] = base.spec["pools"][role]
        else:
            raise ValidationError({role: f"a {spec['mode']} revision needs a {role} variant"})
    extra = sorted(set(variants) - set(roles))
    if extra:
        raise ValidationError({role: f"a {spec['mode']} revision has no {role} pool"
                               for role in extra})
    spec["pools"] = pools
    report = check_spec(deployment, spec)
    if identity(spec) == identity(base.spec):
        raise ValidationError({"non_field_errors": f"the draft equals the live revision "
                                                   f"r{base.number}: nothing to roll out"})
    with transaction.atomic():
        revision = Revision.objects.create(deployment=deployment, number=_next_number(deployment),
                                           spec=spec, state=Revision.State.DRAFT, note=note,
                                           created_by=user)
        record("revision.create", revision, team_id=deployment.team_id, after={
            "deployment": deployment.name, "number": revision.number, "state": revision.state,
            "changes": diff(base.spec, spec)})
    return revision, report


def check_spec(deployment: Deployment, spec: dict[str, Any]) -> Report:
    """The plan's validation and pre-flight checks of ``spec`` laid out on the deployment, in a
    transaction that is rolled back: nothing is saved. Raises ValidationError for an invalid
    spec; the report may still hold failed checks."""
    data = plan_input(spec, layout(deployment, spec))
    with plan_transaction(data, deployment):
        # The ports are the plan's own where a role keeps its instances, proposed otherwise:
        # they only have to be valid here.
        current = stored_pools(deployment)
        for role, instances in data.pools.items():
            for index, instance in enumerate(instances.instances):
                if role in current and index < len(current[role].instances):
                    stored = current[role].instances[index]
                    instance.port, instance.side_channel_port = stored.port, stored.side_channel_port
        report = run_checks(save_plan(data, Deployment.objects.get(pk=deployment.pk)))
        transaction.set_rollback(True)
    return report
