"""The key each vLLM child of the supervisor is started with, and its callers send.

Derived from the console's secret key, as the router's admin token is, so the supervisor that
starts a worker (a node agent's too, which therefore shares PDSERVE_SECRET_KEY) and every caller
(the router, the collector, the gates) compute the same value and nothing is stored: never in
the process table's row, argv or a log line (inference/worker_auth.py says what it guards).
"""

from __future__ import annotations

from django.conf import settings

from console.supervisor.models import ManagedProcess
from inference.worker_auth import derive_key

# The kinds that are vLLM servers.
SERVER_KINDS = (ManagedProcess.Kind.WORKER, ManagedProcess.Kind.GATE_REFERENCE,
                ManagedProcess.Kind.MEASUREMENT)


def deployment_worker_key(deployment_name: str) -> str:
    """The key of every worker of a deployment, green ones of a rollout included."""
    return derive_key(settings.SECRET_KEY, "worker", deployment_name)


def requested_server_key(slot: str) -> str:
    """The key of a requested vLLM server (a gate's reference, a measurement's), by its slot."""
    return derive_key(settings.SECRET_KEY, "requested-worker", slot)


def process_key(record: ManagedProcess) -> str | None:
    """The key ``record``'s process is started with; None for kinds that are no vLLM server."""
    if record.kind not in SERVER_KINDS:
        return None
    if record.deployment_id is not None:
        return deployment_worker_key(record.deployment.name)
    return requested_server_key(record.slot)
