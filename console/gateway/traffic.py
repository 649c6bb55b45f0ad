"""What the gateway's page and API show of each deployment's traffic through the gateway: its
requests and refusals per second (the collector's latest snapshot), and, read live from the
gateway, its requests in flight against the limit and by fairness flow, and who waits in its
queue, by band and flow, summed over the gateway's replicas.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

from django.utils import timezone

from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.router_admin import AdminUnreadable
from console.live.models import MetricSample

# A snapshot older than this describes a deployment that is not collected any more.
FRESH = timedelta(seconds=10)
Key = TypeVar("Key")


class Queue(NamedTuple):
    deployment: str
    in_flight: int
    limit: int
    waiting: dict[tuple[str, str], int]  # (band, flow) -> requests
    holding: dict[str, int]  # flow -> requests in flight


def replica_queues(replica: int) -> list[Queue]:
    """One replica's queues (``GET /admin/queues``); raises AdminUnreadable."""
    body = gateway_process.admin_get(replica, "/admin/queues")
    try:
        return [Queue(entry["deployment"], int(entry["in_flight"]), int(entry["limit"]),
                      {(w["band"], w["flow"]): int(w["requests"]) for w in entry["waiting"]},
                      # A gateway started before per-flow slots were reported (adopted by an
                      # upgraded supervisor) lists none until it restarts.
                      {h["flow"]: int(h["requests"]) for h in entry.get("in_flight_by_flow", [])})
                for entry in body["deployments"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise AdminUnreadable(f"GET /admin/queues: not a queue list ({exc!r})") from exc


def live_queues() -> tuple[dict[str, Queue], list[str]]:
    """Every replica's queues summed by deployment name (each replica holds its share of a
    deployment's limit, console/gateway/routes_config.py), and the replicas that could not be
    read, with why."""
    summed: dict[str, Queue] = {}
    unreadable: list[str] = []
    several = len(gateway_process.replicas()) > 1
    for replica in gateway_process.replicas():
        try:
            queues = replica_queues(replica)
        except AdminUnreadable as exc:
            unreadable.append(f"{gateway_process.slot(replica)}: {exc}" if several else str(exc))
            continue
        for queue in queues:
            total = summed.get(queue.deployment)
            if total is None:
                summed[queue.deployment] = queue
                continue
            summed[queue.deployment] = Queue(queue.deployment, total.in_flight + queue.in_flight,
                                             total.limit + queue.limit,
                                             _added(total.waiting, queue.waiting),
                                             _added(total.holding, queue.holding))
    return summed, unreadable


def _added(one: dict[Key, int], other: dict[Key, int]) -> dict[Key, int]:
    return {name: one.get(name, 0) + other.get(name, 0) for name in {*one, *other}}


def traffic(deployments: list[Deployment]) -> dict[str, Any]:
    """``deployments``' rows (those the caller may see) and the gateway's own state."""
    if not gateway_process.enabled():
        gateway, queues = "off", {}
    else:
        queues, unreadable = live_queues()
        if not unreadable:
            gateway = "running"
        elif len(unreadable) == len(gateway_process.replicas()):
            gateway = f"unreachable: {'; '.join(unreadable)}"
        else:
            gateway = f"running; unreachable: {'; '.join(unreadable)}"
    latest: dict[int, dict[str, Any]] = {}
    for deployment_id, data in (MetricSample.objects.filter(
            deployment__in=deployments, resolution=MetricSample.Resolution.SECOND,
            created__gte=timezone.now() - FRESH).order_by("created")
            .values_list("deployment_id", "data")):
        latest[deployment_id] = data.get("processes", {}).get("router", {})
    rows = []
    for deployment in deployments:
        router = latest.get(deployment.pk, {})
        queue = queues.get(deployment.name)
        rows.append({
            "deployment": deployment.name, "model": deployment.served_model_name,
            "rps": router.get("gateway_rps"), "shed_ps": router.get("gateway_shed_ps"),
            "in_flight": queue.in_flight if queue else None,
            "limit": queue.limit if queue else None,
            "waiting": [{"band": band, "flow": flow, "requests": count}
                        for (band, flow), count in sorted(queue.waiting.items())] if queue else [],
            "in_flight_by_flow": [{"flow": flow, "requests": count}
                                  for flow, count in sorted(queue.holding.items())] if queue else [],
        })
    return {"gateway": gateway, "deployments": rows}
