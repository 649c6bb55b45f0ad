"""Which of the troubleshooting view's eight symptoms an alert belongs to, and the link to it.

The view (console/diagnosis) comes after alerts in the layer order, so the mapping lives here
and the view reads it; the link is built from the URL's name, never by importing the view.
A ready-made rule is known by its key; a rule someone wrote is known by its series.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.urls import reverse

# The symptoms' ids, the anchors of their sections on the view (console/diagnosis/symptoms.py
# gives each its title; tests/console/test_doctor.py holds the two to each other).
BACKEND_UNREACHABLE = "backend-unreachable"
KV_TRANSFER_TIMEOUT = "kv-transfer-timeout"
OOM_AT_START = "oom-at-start"
OUTPUT_DIFFERS = "output-differs"
QUEUEING = "queueing"
TTFT_HIGH = "ttft-high"
STALLS = "stalls"
RESTARTS = "restarts"

SYMPTOM_OF_RULE: dict[str, str] = {
    "worker_down": BACKEND_UNREACHABLE,
    "role_unavailable": BACKEND_UNREACHABLE,
    "port_foreign": BACKEND_UNREACHABLE,
    "node_down": BACKEND_UNREACHABLE,
    "router_5xx": BACKEND_UNREACHABLE,
    "handoff_slow": KV_TRANSFER_TIMEOUT,
    "handoff_failures": KV_TRANSFER_TIMEOUT,
    "memory_near_limit": OOM_AT_START,
    "gate_failed": OUTPUT_DIFFERS,
    "pd_fallback": OUTPUT_DIFFERS,
    "decode_queue": QUEUEING,
    "kv_cache_full": QUEUEING,
    "scale_refused": QUEUEING,
    "pd_load_skew": QUEUEING,
    "ttft_slo": TTFT_HIGH,
    "prefill_queue": TTFT_HIGH,
    "tpot_slo": STALLS,
}

SYMPTOM_OF_SERIES: dict[str, str] = {
    "process.up": BACKEND_UNREACHABLE,
    "deployment.ready_prefill": BACKEND_UNREACHABLE,
    "deployment.ready_decode": BACKEND_UNREACHABLE,
    "deployment.one_sided": BACKEND_UNREACHABLE,
    "deployment.foreign_ports": BACKEND_UNREACHABLE,
    "deployment.node_down": BACKEND_UNREACHABLE,
    "router.5xx_ratio": BACKEND_UNREACHABLE,
    "router.handoff_p95": KV_TRANSFER_TIMEOUT,
    "router.handoff_failed_ratio": KV_TRANSFER_TIMEOUT,
    "process.rss": OOM_AT_START,
    "process.memory_ratio": OOM_AT_START,
    "deployment.gate_failed": OUTPUT_DIFFERS,
    "router.fallback_ratio": OUTPUT_DIFFERS,
    "worker.waiting": QUEUEING,
    "worker.running": QUEUEING,
    "worker.kv_usage": QUEUEING,
    "deployment.scale_refused": QUEUEING,
    "deployment.pd_load_skew": QUEUEING,
    "router.ttft_p95": TTFT_HIGH,
    "worker.ttft_p95": TTFT_HIGH,
    "worker.tpot_p95": STALLS,
    "worker.gen_tps": STALLS,
}


def symptom_of(labels: Mapping[str, str]) -> str | None:
    """The symptom of an alert, from its labels (``rule``: a ready-made rule's key; ``series``)."""
    return SYMPTOM_OF_RULE.get(labels.get("rule", "")) or SYMPTOM_OF_SERIES.get(
        labels.get("series", ""))


def doctor_path(deployment_name: str, symptom: str | None) -> str:
    """The troubleshooting view of the deployment, at the symptom's section when there is one."""
    path = reverse("deployment-doctor", args=[deployment_name])
    return f"{path}#{symptom}" if symptom else path


def doctor_path_of(labels: Mapping[str, str]) -> str | None:
    """The view's link for an alert's labels; none without a deployment label."""
    name = labels.get("deployment")
    return doctor_path(name, symptom_of(labels)) if name else None
