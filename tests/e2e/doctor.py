"""Asking the troubleshooting view (``GET /api/v1/deployments/<id>/doctor``) of a borrowed
deployment until it names a symptom and a cause: the tests that inject faults share this."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.borrowed import Handle

# The collector's 1 s samples, its log tailer and the doctor's one-minute windows.
DOCTOR_WAIT_S = 90


def doctor(borrowed: Handle) -> dict[str, dict[str, Any]]:
    response = borrowed.call("GET", f"/api/v1/deployments/{borrowed.deployment_id}/doctor")
    assert response.status_code == 200, response.text
    return {s["id"]: s for s in response.json()["symptoms"]}


def wait_for_symptom(borrowed: Handle, symptom: str, cause: str,
                     states: tuple[str, ...] = ("present",),
                     while_waiting: Callable[[], None] | None = None) -> dict[str, Any]:
    """Ask the doctor until ``symptom`` is in one of ``states`` with ``cause`` among its
    causes; return the symptom. Fails with the doctor's last word."""
    deadline = time.monotonic() + DOCTOR_WAIT_S
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if while_waiting is not None:
            while_waiting()
        seen = doctor(borrowed)[symptom]
        if seen["state"] in states and cause in [c["id"] for c in seen["causes"]]:
            return seen
        time.sleep(2)
    raise AssertionError(f"the doctor did not name {symptom}/{cause} within {DOCTOR_WAIT_S} s: "
                         f"{seen}")
