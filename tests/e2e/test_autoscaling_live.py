"""Autoscaling on a real deployment: the session's tiny-model 1P1D (tests/borrowed.py) with a
decode policy from 1 to 2 instances on the requests in flight per instance.

Under one load ramp that never pauses: the policy first runs as a dry run (a decision to grow is
recorded, the plan and the processes stay as they are), then goes active: the autoscaler grows
the plan, the supervisor starts decode-1, the router joins it once it is ready and it answers
requests. Once the load stops, decode-1 is drained and removed after the cooldown. The clients
count status codes and SSE error events: not one request fails throughout.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.borrowed import Handle
from tests.borrowed_plan import devices_shared
from tests.e2e.test_rollouts_live import Load

pytestmark = pytest.mark.vllm

# Short windows: the test proves the machine, not the defaults.
# Four clients keep about 1.5 requests in flight on one decode worker (the rest of each
# request's time is in prefill and the router): above 1, a second is asked for. One client on
# two workers keeps about 0.2 on each: between the thresholds, the pool stays.
POLICY = {"mode": "dry_run", "signal": "concurrency", "min_instances": 1, "max_instances": 2,
          "scale_up_at": 1.0, "scale_down_at": 0.05, "up_window_s": 10, "down_window_s": 20,
          "max_step": 1, "cooldown_s": 30}
START_TIMEOUT_S = 600.0
BASE_CLIENTS, SURGE_CLIENTS = 1, 3


def _wait(condition: Callable[[], Any], what: str, timeout_s: float,
          interval_s: float = 1.0, handle: Handle | None = None) -> Any:
    """Poll until ``condition()`` gives something true; return it. A timeout says what the
    autoscaler saw last (``handle``'s pools and decisions)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            seen = ""
            if handle is not None:
                pools = handle.call(
                    "GET", f"/api/v1/deployments/{handle.deployment_id}/autoscaling/").json()
                seen = f"; pools {pools}; decisions {_decisions(handle)[:5]}"
            raise AssertionError(f"{what}: not within {timeout_s:g} s{seen}")
        time.sleep(interval_s)


def _decisions(handle: Handle, **params: str) -> list[dict[str, Any]]:
    response = handle.call("GET", f"/api/v1/deployments/{handle.deployment_id}/scaling-decisions/",
                           params={"role": "decode", "limit": 200, **params})
    response.raise_for_status()
    return response.json()["results"]


def _decode_slots(handle: Handle) -> list[str]:
    return sorted(f"decode-{w['index']}" for w in handle.deployment()["workers"]
                  if w["role"] == "decode")


@dataclass
class Ramp:
    """Clients that never pause (streamed and whole answers, each counted): one all along, and
    a surge of three more that can end on its own."""

    base: Load
    surge: Load

    @property
    def answers(self) -> list[tuple[int, str, str, str]]:
        return [*self.base.answers, *self.surge.answers]


@pytest.fixture
def ramp(borrowed: Handle) -> Iterator[Ramp]:
    ramp = Ramp(Load(borrowed.router, borrowed.served_model_name),
                Load(borrowed.router, borrowed.served_model_name))
    threads = [threading.Thread(target=load.run, args=(None, index % 2 == 0), daemon=True)
               for load, clients in ((ramp.base, BASE_CLIENTS), (ramp.surge, SURGE_CLIENTS))
               for index in range(clients)]
    for thread in threads:
        thread.start()
    yield ramp
    ramp.base.stop.set()
    ramp.surge.stop.set()
    for thread in threads:
        thread.join(timeout=130)


@pytest.fixture
def shared_devices(borrowed: Handle) -> Iterator[None]:
    with devices_shared(borrowed):
        yield


@pytest.fixture
def policy(borrowed: Handle, shared_devices: None) -> Iterator[str]:
    path = f"/api/v1/deployments/{borrowed.deployment_id}/autoscaling/decode/"
    response = borrowed.call("PUT", path, json=POLICY)
    assert response.status_code == 201, response.text
    yield path
    # The deployment goes back to the next borrower without a policy acting on it.
    borrowed.call("DELETE", path)


def test_load_grows_decode_and_quiet_shrinks_it(borrowed: Handle, ramp: Ramp,
                                                policy: str) -> None:
    load_started = time.time()
    # Dry run: the decision to grow is recorded; nothing changes.
    dry = _wait(lambda: [d for d in _decisions(borrowed) if d["action"] == "up"],
                "a dry-run decision to grow decode", 120, handle=borrowed)[0]
    assert dry["dry_run"] is True and dry["current"] == 1 and dry["target"] == 2, dry
    assert dry["inputs"]["in_flight"] > POLICY["scale_up_at"], dry["inputs"]
    pids = {slot: p["pid"] for slot, p in borrowed.processes().items()}
    assert dry["slots"] == [] and dry["progress"] == {}
    time.sleep(6)  # a tick or more later, still one decode worker, planned and running
    assert _decode_slots(borrowed) == ["decode-0"]
    assert "decode-1" not in borrowed.processes()

    active_at = time.time()
    response = borrowed.call("PATCH", policy, json={"mode": "active"})
    assert response.status_code == 200, response.text
    grown = _wait(lambda: [d for d in _decisions(borrowed) if d["action"] == "up"
                           and not d["dry_run"]], "the autoscaler growing decode", 60, handle=borrowed)[0]
    assert grown["slots"] and grown["slots"][0]["slot"] == "decode-1", grown
    assert _decode_slots(borrowed) == ["decode-0", "decode-1"]
    url = grown["slots"][0]["url"]
    # The surge ends: on two cores, four clients (or two) made decode-1's start take 7 minutes.
    # The one left keeps each of two decode workers between the thresholds: the pool stays.
    ramp.surge.stop.set()
    # Growing one pool touches no running worker.
    assert {slot: borrowed.processes()[slot]["pid"] for slot in pids} == pids

    def joined() -> dict[str, Any] | None:
        row = next(d for d in _decisions(borrowed) if d["id"] == grown["id"])
        return row if "decode_1_joined_at" in row["progress"] else None

    progress = _wait(joined, "decode-1 ready and joined to the router", START_TIMEOUT_S,
                     interval_s=2.0, handle=borrowed)["progress"]
    # Joined means serving: decode-1's own engine answers requests of the load.
    _wait(lambda: _served(url, borrowed.worker_headers()) > 0, "decode-1 serving requests of the load", 60)

    served_before_quiet = len(ramp.answers)
    ramp.base.stop.set()
    quiet_at = time.time()
    shrunk = _wait(lambda: [d for d in _decisions(borrowed, reason="scaled")
                            if d["action"] == "down" and not d["dry_run"]],
                   "the autoscaler shrinking decode once the load stopped",
                   POLICY["cooldown_s"] + POLICY["down_window_s"] + 90, handle=borrowed)[0]
    assert shrunk["current"] == 2 and shrunk["target"] == 1
    assert shrunk["slots"] == [{"slot": "decode-1", "url": url}]
    # Drained first, then stopped: it left the router's pools before its process ended.
    stopped = _wait(lambda: next(d for d in _decisions(borrowed) if d["id"] == shrunk["id"])
                    ["progress"].get("decode_1_stopped_at"), "decode-1 stopped", 180)
    left = next(d for d in _decisions(borrowed) if d["id"] == shrunk["id"])["progress"].get(
        "decode_1_left_at")
    assert left is not None and left <= stopped
    assert _decode_slots(borrowed) == ["decode-0"]
    assert "decode-1" not in borrowed.processes() or (
        borrowed.processes()["decode-1"]["state"] not in ("ready", "starting"))

    statuses = Counter(status for status, *_ in ramp.answers)
    failures = [answer for answer in ramp.answers if answer[0] != 200]
    assert not failures, f"{len(failures)} of {len(ramp.answers)} failed: {failures[:5]}"
    assert served_before_quiet > 50, statuses

    decided, ready, joined_at = (datetime.fromisoformat(grown["at"]).timestamp(),
                                 datetime.fromisoformat(progress["decode_1_ready_at"]).timestamp(),
                                 datetime.fromisoformat(progress["decode_1_joined_at"]).timestamp())
    removed = datetime.fromisoformat(shrunk["at"]).timestamp()
    dry_at = datetime.fromisoformat(dry["at"]).timestamp()
    print(f"\nautoscaling: dry-run decision {dry_at - load_started:.1f} s "
          f"after the load began; active decision {decided - active_at:.1f} s after the switch; "
          f"start {ready - decided:.1f} s; join {joined_at - ready:.1f} s; removal decided "
          f"{removed - quiet_at:.1f} s after the load stopped; {len(ramp.answers)} requests, "
          f"statuses {dict(statuses)}")


def _served(url: str, headers: dict[str, str]) -> float:
    """Requests decode-1's engine finished, from its own /metrics."""
    try:
        text = httpx.get(f"{url}/metrics", headers=headers, timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))
