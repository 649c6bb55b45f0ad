"""What the gateway's page and API show of each deployment's traffic through the gateway: its
requests and refusals per second (the collector's latest snapshot), and, read live from the
gateway, its requests in flight against the limit and who waits in its queue, by band and flow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from django.utils import timezone

from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.gateway.router_admin import AdminUnreadable
from console.live.models import MetricSample

TIMEOUT_S = 2.0
# A snapshot older than this describes a deployment that is not collected any more.
FRESH = timedelta(seconds=10)


def live_queues() -> dict[str, dict[str, Any]]:
    """The gateway's queues by deployment name (``GET /admin/queues``); raises AdminUnreadable."""
    try:
        response = httpx.get(f"{gateway_process.url()}/admin/queues", timeout=TIMEOUT_S,
                             headers={"Authorization": f"Bearer {gateway_process.admin_token()}"})
    except httpx.HTTPError as exc:
        raise AdminUnreadable(f"GET /admin/queues: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise AdminUnreadable(f"GET /admin/queues: {response.status_code} {response.text[:200]}")
    try:
        return {entry["deployment"]: entry for entry in response.json()["deployments"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise AdminUnreadable(f"GET /admin/queues: not a queue list ({exc!r})") from exc


def traffic(deployments: list[Deployment]) -> dict[str, Any]:
    """``deployments``' rows (those the caller may see) and the gateway's own state."""
    if not gateway_process.enabled():
        gateway, queues = "off", {}
    else:
        try:
            gateway, queues = "running", live_queues()
        except AdminUnreadable as exc:
            gateway, queues = f"unreachable: {exc}", {}
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
            "in_flight": queue["in_flight"] if queue else None,
            "limit": queue["limit"] if queue else None,
            "waiting": queue["waiting"] if queue else [],
        })
    return {"gateway": gateway, "deployments": rows}
