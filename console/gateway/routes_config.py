"""What the gateway is told (inference/gateway/config.py): every deployment with its served
name, its router's address while that router is ready, and its state; the aliases with their
ordered targets; the keys with the deployments each may use (hashes, never secrets).

Built from the database on every sync round; its version is a hash of the rest, so the
supervisor's sync pushes it only when something changed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

from django.conf import settings

from console.deployments.models import Deployment
from console.gateway.models import ApiKey, ModelAlias
from console.gateway.router_admin import router_address
from console.supervisor.models import ManagedProcess


def _state(deployment: Deployment, router: ManagedProcess | None) -> str:
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        return "stopped"
    if router is None:
        return "starting"
    return f"degraded (no {router.degraded})" if router.degraded else "running"


def in_scope(key: ApiKey, deployment: Deployment) -> bool:
    if key.all_deployments:
        return key.team_id == deployment.team_id
    return any(d.pk == deployment.pk for d in key.deployments.all())


def ready_routers() -> dict[int, ManagedProcess]:
    """Each deployment's ready router, by deployment id."""
    return {process.deployment_id: process for process in ManagedProcess.objects.filter(
        role="router", state=ManagedProcess.State.READY, deployment__isnull=False).order_by()}


def serving_workers() -> Counter[int]:
    """Ready workers that generate (decode, colocated), by deployment id."""
    return Counter(ManagedProcess.objects.filter(
        kind=ManagedProcess.Kind.WORKER, role__in=("decode", "colocated"),
        state=ManagedProcess.State.READY, deployment__isnull=False,
    ).values_list("deployment_id", flat=True).order_by())


def max_in_flight(deployment: Deployment, serving: int) -> int:
    """Requests the gateway lets in flight to a deployment before it queues them: the plan's
    concurrency (what each worker's KV cache holds at full context) times the workers that
    generate. Past it, requests would wait in an engine's queue, where they can no longer be
    put in priority order."""
    return deployment.concurrency * max(1, serving)


def replica_share(limit: int, replicas: int) -> int:
    """One gateway replica's part of a deployment's in-flight limit: the limit divided among
    the replicas, rounded up, so that together they hold the plan's concurrency (over by less
    than one request per replica). Each replica counts only its own requests: sharing one
    counter through Redis would put a round trip on every request's admission and release, and
    a load balancer in front spreads clients evenly enough that the shares fill together (NGINX
    splits its limits per worker process for the same reason)."""
    return math.ceil(limit / replicas)


def states(deployments: list[Deployment]) -> dict[str, str]:
    """What the gateway says of each deployment's state, by name (the gateway page's column)."""
    ready = ready_routers()
    return {d.name: _state(d, ready.get(d.pk)) for d in deployments}


def gateway_config() -> dict[str, Any]:
    deployments = list(Deployment.objects.select_related("team").order_by("pk"))
    ready = ready_routers()
    serving = serving_workers()
    keys = list(ApiKey.objects.select_related("team").prefetch_related("deployments").order_by("pk"))
    entries = []
    for deployment in deployments:
        router = ready.get(deployment.pk)
        entries.append({
            "name": deployment.name, "served_model_name": deployment.served_model_name,
            "router": router_address(deployment) if router is not None else None,
            "state": _state(deployment, router), "team": deployment.team.name,
            # As the deployment's own router decides: open until a key is made for it.
            "require_key": any(in_scope(key, deployment) for key in keys),
            "max_concurrency": replica_share(max_in_flight(deployment, serving[deployment.pk]),
                                             settings.PDSERVE_GATEWAY_REPLICAS),
        })
    served = {deployment.served_model_name for deployment in deployments}
    # An alias whose name a deployment took later is left out: the served name wins (the
    # gateway page says so), and the gateway refuses a configuration with both.
    aliases = [{"name": alias.name, "targets": alias.target_names()}
               for alias in ModelAlias.objects.prefetch_related("targets__deployment")
               if alias.name not in served and alias.targets.all()]
    key_entries = [{"id": key.pk, "prefix": key.prefix, "hash": key.key_hash,
                    "state": "revoked" if key.revoked else "active",
                    "deployments": [d.name for d in deployments if in_scope(key, d)],
                    # Its team is its fairness flow in the gateway's queues.
                    "team": key.team.name, "priority": key.priority,
                    "priority_header": key.priority_header}
                   for key in keys]
    body = {"deployments": entries, "aliases": aliases, "keys": key_entries,
            "queue": {"max_queue": settings.PDSERVE_GATEWAY_MAX_QUEUE,
                      "timeout_s": settings.PDSERVE_GATEWAY_QUEUE_TIMEOUT_S}}
    return versioned(body)


def versioned(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the version of its content (any ``version`` it had left out)."""
    body = {key: value for key, value in config.items() if key != "version"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": digest, **body}
