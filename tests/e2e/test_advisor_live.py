"""The topology advisor on a real deployment: the session's tiny-model 1P1D (tests/borrowed.py).

What the console does when a user presses "Measure speeds now" and then "Roll out": the speeds
of the plan's variant are measured on a vLLM server the supervisor starts (a Celery task asks
for it), the advice for a light load ranks colocated x1 first (every candidate serves it within
the SLOs, and a tie goes to fewer servers), and one call drafts that topology and rolls it out
blue-green with the rollout machinery. Requests keep being answered through the switch and
after it. This is the borrowed deployment's last test (tests/e2e/conftest.py), so the
deployment stops colocated: restoring the PD plan would be two vLLM starts for nobody.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from inference.advisor.speeds import speeds_from_json
from tests.borrowed import Handle

pytestmark = pytest.mark.vllm

MEASURE_TIMEOUT_S = 600.0
ROLLOUT_TIMEOUT_S = 600.0
LIGHT = {"rate_per_s": "0.5", "prompt_tokens": "32,64", "output_tokens": "8,16"}


def _measured(handle: Handle) -> dict[str, Any]:
    path = f"/api/v1/deployments/{handle.deployment_id}/advice/"
    deadline = time.monotonic() + MEASURE_TIMEOUT_S
    seen_progress = 0
    while True:
        response = handle.call("GET", path, params=LIGHT)
        assert response.status_code == 200, response.text
        advice = response.json()
        measurement = advice["measurement"]
        seen_progress = max(seen_progress, len(measurement["progress"]))
        if measurement["state"] in ("done", "failed"):
            assert measurement["state"] == "done", measurement["error"]
            # Progress was shown while it ran, and kept.
            assert seen_progress > 0 and measurement["progress"], measurement
            return advice
        assert time.monotonic() < deadline, f"no speeds after {MEASURE_TIMEOUT_S} s: {measurement}"
        time.sleep(1.0)


def _finished(handle: Handle, rollout_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while True:
        body = handle.call("GET", f"/api/v1/rollouts/{rollout_id}/").json()
        if body["state"] in ("succeeded", "rolled_back"):
            assert body["state"] == "succeeded", (body["reason"], body["transitions"])
            return body
        assert handle.complete().status_code == 200  # served through the switch
        assert time.monotonic() < deadline, f"rollout #{rollout_id} not done: {body['state']}"
        time.sleep(1.0)


def test_measured_advice_rolls_its_recommendation_out_in_one_call(borrowed: Handle) -> None:
    before = borrowed.deployment()
    assert before["mode"] == "pd"
    first = before["revision"]["number"]
    base = f"/api/v1/deployments/{borrowed.deployment_id}"

    # 1. Nothing measured yet: the advice says so and names what to measure.
    unmeasured = borrowed.call("GET", f"{base}/advice/", params=LIGHT).json()
    assert unmeasured["status"] == "not_measured", unmeasured
    queued = borrowed.call("POST", f"{base}/advice/measure/")
    assert queued.status_code == 202, queued.text
    assert borrowed.call("POST", f"{base}/advice/measure/").status_code == 409  # once at a time

    # 2. The measured speeds, on the tiny model: curves the simulator reads.
    began = time.monotonic()
    advice = _measured(borrowed)
    print(f"\nspeeds measured in {time.monotonic() - began:.0f} s: {advice['measurement']['speeds']}")
    speeds = advice["measurement"]["speeds"]
    assert {"prefill_ms", "decode_step_ms", "interference"} <= set(speeds), speeds
    assert all(ms > 0 for row in speeds["prefill_ms"]["ms"] for ms in row), speeds
    assert all(ms > 0 for row in speeds["decode_step_ms"]["ms"] for ms in row), speeds
    assert advice["status"] == "advised", advice
    assert advice["current"] == "PD 1P:1D"
    ranked = [c["topology"] for c in advice["candidates"]]
    assert "PD 1P:1D" in ranked and ranked[0] == advice["recommended"] == "colocated x1", ranked
    assert advice["switch"] is True
    # The light load is served whole by the recommendation. (Not asserted of every candidate:
    # the neighbour factor of a tiny model measured on a loaded 2-core machine can be large.)
    assert advice["candidates"][0]["slo_attained"] == 1.0, advice["candidates"]
    # Every stage ran and showed its progress, the neighbour's beside a second server, and the
    # stored speeds are what the simulator reads (with the factor that stage reported).
    progress = advice["measurement"]["progress"]
    assert {e["stage"] for e in progress} == {"prefill", "decode", "interference", "neighbour",
                                              "handoff"}, progress
    reported = [e["factor"] for e in progress if e["stage"] == "neighbour"]
    assert speeds_from_json(speeds).neighbour_factor == reported[-1] == speeds["neighbour"]["factor"]

    # 3. One call: the draft revision and its blue-green rollout, requests answered throughout.
    applied = borrowed.call("POST", f"{base}/advice/apply/", json=LIGHT)
    assert applied.status_code == 201, applied.text
    assert applied.json()["topology"] == "colocated x1"
    began = time.monotonic()
    _finished(borrowed, applied.json()["rollout"])
    print(f"rollout to colocated x1 succeeded in {time.monotonic() - began:.0f} s")
    after = borrowed.deployment()
    assert after["mode"] == "colocated", after
    assert after["revision"]["number"] == applied.json()["revision"] > first
    assert [w["role"] for w in after["workers"]] == ["colocated"]
    answered = borrowed.complete()
    assert answered.status_code == 200, answered.text
    # The advice now has the recommendation as its current plan: nothing more to apply.
    again = borrowed.call("POST", f"{base}/advice/apply/", json=LIGHT)
    assert again.status_code == 409 and "current plan already" in again.text, again.text

