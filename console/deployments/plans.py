"""Writing a deployment plan: the plan's fields and its pools, saved together or not at all.

The browser form and the REST serializer each turn their input into a :class:`PlanInput`;
``save_plan`` is the one place a plan is written. Values an instance leaves out (port,
side-channel port, cores or GPU) are proposed here, free and without collisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from console.catalog.models import Variant
from console.deployments import engine_args
from console.deployments.models import Deployment, WorkerPlan
from console.deployments.placement import Ledger
from console.fleet.models import Node
from console.fleet.services import local_node

MAX_INSTANCES = 64
POOL_ROLES = {Deployment.Mode.PD: ("prefill", "decode"),
              Deployment.Mode.COLOCATED: ("colocated",)}


@dataclass
class InstanceInput:
    node: Node | None = None
    cpu_cores: str | None = None  # None: proposed
    gpu_indices: str | None = None  # None: proposed when the node has GPUs
    port: int | None = None
    side_channel_port: int | None = None
    share_devices: bool = False


@dataclass
class PoolInput:
    variant: Variant
    instances: list[InstanceInput]


@dataclass
class PlanInput:
    fields: dict[str, Any] = field(default_factory=dict)
    # role -> pool, as given
    pools: dict[str, PoolInput] = field(default_factory=dict)
    # A partial update keeps the stored pools it does not give (those the plan's mode uses).
    partial: bool = False


def pool_errors(mode: str, pools: dict[str, PoolInput]) -> dict[str, str]:
    """Which pools a mode needs and forbids, keyed by the pool's field name."""
    wanted = POOL_ROLES[Deployment.Mode(mode)]
    errors = {}
    for role in wanted:
        pool = pools.get(role)
        if pool is None or not pool.instances:
            errors[role] = f"a {mode} plan needs at least one {role} instance"
        elif len(pool.instances) > MAX_INSTANCES:
            errors[role] = f"at most {MAX_INSTANCES} instances per pool"
    for role in pools:
        if role not in wanted:
            errors[role] = f"a {mode} plan has no {role} pool"
    return errors


@contextlib.contextmanager
def plan_transaction(data: PlanInput, deployment: Deployment | None) -> Iterator[None]:
    """The write transaction of a caller that saves ``data``: what validating it imports (vLLM's
    parser for the extra engine flags it sets, or the stored ones) is paid before the
    transaction begins, so that no write lock is held through the import
    (engine_args.load_parser says why)."""
    stored = deployment.extra_engine_args if deployment is not None else None
    engine_args.load_parser(data.fields.get(engine_args.FIELD, stored))
    with transaction.atomic():
        yield


@transaction.atomic
def save_plan(data: PlanInput, deployment: Deployment | None = None) -> Deployment:
    """Create or update a plan; raises ValidationError (keyed by field) and saves nothing then."""
    deployment = deployment or Deployment()
    stored = stored_pools(deployment) if deployment.pk else {}
    for name, value in data.fields.items():
        setattr(deployment, name, value)
    if deployment.pk is None and "router_port" not in data.fields:
        deployment.router_port = _router_port(data)
    deployment.full_clean()
    deployment.save()
    pools = _pools(data, deployment, stored)
    if pools is not None:
        errors = pool_errors(deployment.mode, pools)
        if errors:
            raise ValidationError(errors)
        _replace_workers(deployment, pools)
    return deployment


def _pools(data: PlanInput, deployment: Deployment,
           stored: dict[str, PoolInput]) -> dict[str, PoolInput] | None:
    """The pools the plan will have; None when they stay as stored."""
    if not data.partial:
        return data.pools
    if not data.pools and "mode" not in data.fields:
        return None
    kept = {role: pool for role, pool in stored.items()
            if role in POOL_ROLES[Deployment.Mode(deployment.mode)]}
    return {**kept, **data.pools}


def _router_port(data: PlanInput) -> int:
    """A free router port on this machine, where the router runs."""
    ledger = Ledger.for_node(local_node(), exclude=None)
    ledger.ports |= {port for pool in data.pools.values() for i in pool.instances
                     for port in (i.port, i.side_channel_port) if port}
    return ledger.router_port()


def _replace_workers(deployment: Deployment, pools: dict[str, PoolInput]) -> None:
    # Slots are role-index; the supervisor keys processes by slot, so rewriting the rows keeps
    # running processes attached to their slot.
    deployment.workers.all().delete()
    default_node = local_node()
    placed = [(role, index, instance, instance.node or default_node)
              for role, pool in pools.items() for index, instance in enumerate(pool.instances)]
    # Explicit values first, so that proposals avoid every value the operator chose.
    ledgers: dict[int, Ledger] = {}
    for node in {n.pk: n for *_, n in placed}.values():
        chosen = [WorkerPlan(port=i.port or 0, side_channel_port=i.side_channel_port,
                             cpu_cores=i.cpu_cores or "", gpu_indices=i.gpu_indices or "",
                             node=node)
                  for *_, i, n in placed if n.pk == node.pk]
        ledgers[node.pk] = Ledger.for_node(node, exclude=deployment, drafts=chosen)
        if node.is_local:
            ledgers[node.pk].ports.add(deployment.router_port)
    errors: dict[str, list[str]] = {}
    for role, index, instance, node in placed:
        ledger = ledgers[node.pk]
        worker = WorkerPlan(
            deployment=deployment, role=role, index=index, variant=pools[role].variant, node=node,
            host="127.0.0.1" if node.is_local else node.address,
            port=instance.port or ledger.port(role),
            side_channel_port=instance.side_channel_port or ledger.side_channel_port(),
            share_devices=instance.share_devices,
            **_devices(instance, ledger),
        )
        try:
            worker.full_clean(exclude=["deployment", "variant", "node"])
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                errors[f"{role}.instances.{index}.{name}"] = messages
            continue
        worker.save()
    if errors:
        raise ValidationError(errors)


def _devices(instance: InstanceInput, ledger: Ledger) -> dict[str, str]:
    gpus = instance.gpu_indices
    if gpus is None:
        gpus = ledger.gpu() if instance.cpu_cores is None else ""
    cores = instance.cpu_cores
    if cores is None:
        cores = "" if gpus else ledger.core()
    return {"cpu_cores": cores, "gpu_indices": gpus}


def stored_pools(deployment: Deployment) -> dict[str, PoolInput]:
    """The plan's pools as they are stored, every value explicit."""
    pools: dict[str, PoolInput] = {}
    for worker in deployment.workers.select_related("variant", "node").order_by("role", "index"):
        pool = pools.setdefault(worker.role, PoolInput(variant=worker.variant, instances=[]))
        pool.instances.append(InstanceInput(
            node=worker.node, cpu_cores=worker.cpu_cores, gpu_indices=worker.gpu_indices,
            port=worker.port, side_channel_port=worker.side_channel_port,
            share_devices=worker.share_devices,
        ))
    return pools
