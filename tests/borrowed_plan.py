"""A borrowed deployment's plan: as the console reads it (``plan_of``), as its API takes it
(``plan_body``), compared without worker ports, and a live edit that lets a third worker share
the plan's cores (``devices_shared``). tests/borrowed.py puts the plan back with these."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import httpx

# The keys of a deployment's reading that are its state; the others are its plan.
NOT_PLAN = frozenset({"state", "desired_state", "degraded", "processes", "created", "updated",
                      "revision", "rollout"})


class PlanHandle(Protocol):
    """What a plan edit needs of a borrowed deployment's handle (tests/borrowed.py's Handle)."""

    deployment_id: int

    def deployment(self) -> dict[str, Any]: ...

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...


def planned_slots(deployment: dict[str, Any]) -> set[str]:
    """The slots a deployment (as read) plans: its workers' and the router."""
    return {w["slot"] for w in deployment["workers"]} | {"router"}


def current_processes(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A deployment's processes (as read) by slot, but for the stopped rows that slots a
    borrower added and removed leave behind (an autoscaled decode-1, a rollout's green): the
    process table keeps them as history, and they hold up nothing."""
    planned = planned_slots(deployment)
    return {p["slot"]: p for p in deployment["processes"]
            if p["slot"] in planned or p["state"] != "stopped"}


def plan_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in deployment.items() if key not in NOT_PLAN}


def without_ports(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan (``plan_of``) with its workers' ports left out."""
    ports = ("port", "side_channel_port")
    return {**plan, "workers": sorted(
        ({key: value for key, value in worker.items() if key not in ports}
         for worker in plan.get("workers", [])), key=lambda worker: worker["slot"])}


def plan_body(deployment: dict[str, Any]) -> dict[str, Any]:
    """The write form (PUT /api/v1/deployments/<id>/) of a deployment as read."""
    body = {key: deployment[key] for key in (
        "name", "base_model", "served_model_name", "mode", "max_model_len", "longest_request",
        "concurrency", "kv_channel", "kv_cache_gib", "block_size", "kv_cache_dtype",
        "kv_load_failure", "dtype", "engine_version", "sampling_defaults")}
    for worker in sorted(deployment["workers"], key=lambda w: (w["role"], w["index"])):
        pool = body.setdefault(worker["role"], {"variant": worker["variant_id"], "instances": []})
        pool["instances"].append({key: worker[key] for key in (
            "node", "cpu_cores", "gpu_indices", "port", "side_channel_port", "share_devices")})
    body["router"] = {key: value for key, value in deployment["router"].items() if key != "host"}
    body["gate"] = {key: deployment["gate"][key] for key in (
        "mode", "prompts", "min_agreement", "max_mean_logprob_delta", "action")}
    return body


@contextmanager
def devices_shared(handle: PlanHandle) -> Iterator[None]:
    """The borrowed plan pins prefill to core 0 and decode to core 1 of this 2-core machine: a
    third worker shares a core, which the plan must declare (else the device check refuses it,
    as it should). A live edit: no worker restarts. The original plan comes back after."""
    original = plan_body(handle.deployment())
    shared = copy.deepcopy(original)
    for role in ("prefill", "decode"):
        for instance in shared[role]["instances"]:
            instance["share_devices"] = True
    path = f"/api/v1/deployments/{handle.deployment_id}/"
    response = handle.call("PUT", path, json=shared)
    assert response.status_code == 200, response.text
    try:
        yield
    finally:
        response = handle.call("PUT", path, json=original)
        assert response.status_code == 200, response.text
