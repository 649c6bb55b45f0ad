"""A canary rollout of the default SmolLM2 deployment under the load its users put on it: vLLM's
own benchmark client (`vllm bench serve`) sending chat requests through the router, on this
2-core machine. The last of the stack's users (tests/e2e/conftest.py): it leaves the deployment
at the new revision, then kills its decode (prefill answers meanwhile, and the supervisor starts
decode again) and stops it while that decode is starting: no vLLM process is left.

The rollout first meets a trickle too thin for its analysis window (green at 30% of one request
every few seconds) and pauses with "inconclusive: not enough traffic", never an endless hold;
resumed under the benchmark's steady 2 requests/s, it finishes (`succeeded`), and neither the
benchmark nor the trickle loses a request.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from bench import serve_client
from tests.e2e.conftest import Stack
from tests.e2e.test_failover import metric

pytestmark = pytest.mark.vllm

# Green at 30% of a trickle of one request every 5 s or so: two or three requests in the 30 s
# bound, below the minimum of 4 per side, so the window ends inconclusive and the rollout
# pauses. Under the benchmark's 2 requests/s green has its 4 in a few seconds.
CANARY = {"steps": [{"weight": 30, "hold_s": 10}, {"weight": 100, "hold_s": 0}],
          "analysis": {"interval_s": 5, "failure_limit": 2, "min_requests": 4,
                       "max_inconclusive_s": 30,
                       "metrics": {"error_rate": {"max": 0.0}, "handoff_failure_rate": {"max": 0.0},
                                   "ttft_p95": {"max_ratio": 20}}},
          "scale_down_delay_s": 5, "drain_timeout_s": 60}
TRICKLE_PAUSE_S = 4.0
# The benchmark: 2 requests/s for about 100 s, chat, 128 tokens in and 32 out. Resumed once
# the router has answered its first requests, the rollout succeeded about 40 s later; the rest
# of the benchmark only has to outlast it.
STEADY = serve_client.Workload(input_len=128, output_len=32, num_prompts=200, rate=2.0,
                               concurrency=16, api="chat", seed=7)
GREEN_START_TIMEOUT_S = 600.0
QUESTION = [{"role": "user", "content": "Name a city on a river."}]
DEGRADED = "pdserve_router_degraded_total"
ANSWERED = "pdserve_router_requests_total"
# The trickle answers one request in 4 s or more: 12 more answers mean the benchmark's load.
LOAD_ARRIVED_ANSWERS = 12
LOAD_ARRIVES_S = 300.0


@dataclass
class Trickle:
    """One client, one chat request every few seconds; every outcome kept."""

    router: str
    outcomes: list[tuple[float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    response = client.post(f"{self.router}/v1/chat/completions", json={
                        "model": "smollm2", "messages": QUESTION, "max_tokens": 8})
                    self.outcomes.append((sent, response.status_code, response.text[:200]))
                except httpx.HTTPError as exc:
                    self.outcomes.append((sent, 0, repr(exc)))
                self.stop.wait(TRICKLE_PAUSE_S)

    def failed(self) -> list[tuple[float, int, str]]:
        return [outcome for outcome in self.outcomes if outcome[1] != 200]


@pytest.fixture
def trickle(stack: Stack) -> Iterator[Trickle]:
    load = Trickle(stack.router)
    thread = threading.Thread(target=load.run, daemon=True)
    thread.start()
    yield load
    load.stop.set()
    thread.join(timeout=130)


def _rollout(stack: Stack, rollout_id: int) -> dict[str, Any]:
    response = stack.call("GET", f"/api/v1/rollouts/{rollout_id}/")
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def _wait_rollout(stack: Stack, rollout_id: int, done: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    body = _rollout(stack, rollout_id)
    while not done(body):
        assert body["state"] not in ("rolled_back", "succeeded"), (body["reason"],
                                                                   body["transitions"])
        assert time.monotonic() < deadline, f"rollout #{rollout_id} after {timeout_s} s: {body}"
        time.sleep(1)
        body = _rollout(stack, rollout_id)
    return body


def _wait_for_load(stack: Stack, client: subprocess.Popen[bytes], answered_before: float
                   ) -> None:
    """Until the router has answered the client's first requests: the client imports vLLM and
    samples its prompts first, which took more than the 10 s once waited here on a slow CI
    machine, and a rollout resumed before the load arrives pauses again on the same trickle."""
    deadline = time.monotonic() + LOAD_ARRIVES_S
    while metric(stack.router, ANSWERED) - answered_before < LOAD_ARRIVED_ANSWERS:
        assert client.poll() is None, "the benchmark client exited before its load arrived"
        assert time.monotonic() < deadline, f"no load through the router in {LOAD_ARRIVES_S} s"
        time.sleep(1)


def _phases(body: dict[str, Any]) -> list[str]:
    """Each transition with the seconds since the rollout began, for the closing note."""
    rows = body["transitions"]
    began = datetime.fromisoformat(rows[0]["at"])
    return [f"  +{(datetime.fromisoformat(r['at']) - began).total_seconds():6.1f} s  "
            f"{r['from_state'] or '-'} -> {r['to_state']} {r['weights']}: {r['reason'][:90]}"
            for r in rows]


def test_a_canary_pauses_on_a_trickle_and_finishes_under_a_real_client_s_steady_load(
        stack: Stack, model_dir: Path, tmp_path: Path, trickle: Trickle) -> None:
    deployment = f"/api/v1/deployments/{stack.deployment_id}"
    first = stack.deployment()["revision"]["number"]
    draft = stack.call("POST", f"{deployment}/revisions/", json={
        "extra_engine_args": ["--max-num-seqs", "64"], "gate": {"mode": "off"},
        "note": "the issue's change"})
    assert draft.status_code == 201, draft.text
    green = draft.json()["number"]
    started = stack.call("POST", "/api/v1/rollouts/", json={
        "deployment": stack.deployment_id, "revision": green, "strategy": "canary", **CANARY})
    assert started.status_code == 201, started.text
    rollout_id = started.json()["id"]

    # 1. The trickle: green starts (its phases on the rollout), takes 30%, and the window
    # never fills: paused with the reason.
    paused = _wait_rollout(stack, rollout_id, lambda b: b["state"] == "paused",
                           GREEN_START_TIMEOUT_S + 120)
    assert paused["reason"].startswith("inconclusive: not enough traffic"), paused["reason"]
    assert paused["paused_from"] == "stepping" and paused["weights"][str(green)] == 30
    workers = paused["progress"]["workers"]
    assert len(workers) == 2 and {w["phase"] for w in workers.values()} == {"ready"}, workers

    # 2. The steady load, then resume: windows fill, the steps pass, blue drains.
    out = tmp_path / "steady.json"
    answered = metric(stack.router, ANSWERED)
    client = serve_client.start(stack.router, "smollm2", model_dir, STEADY, out)
    try:
        _wait_for_load(stack, client, answered)
        resumed = stack.call("POST", f"/api/v1/rollouts/{rollout_id}/resume/")
        assert resumed.status_code == 200, resumed.text
        done = _wait_rollout(stack, rollout_id, lambda b: b["state"] == "succeeded", 600)
        finished_under_load = client.poll() is None
        steady = serve_client.result(client, out, timeout_s=600)
    finally:
        if client.poll() is None:
            client.kill()
    print(f"\ncanary r{first} -> r{green} of smollm2-1p1d, trickle then "
          f"{STEADY.rate:.0f} req/s from vllm bench serve:\n" + "\n".join(_phases(done)))
    print(f"benchmark: {steady['completed']} completed, {steady['failed']} failed of "
          f"{STEADY.num_prompts}; TTFT p99 {steady['p99_ttft_ms']:.0f} ms; trickle "
          f"{len(trickle.outcomes)} sent, {len(trickle.failed())} failed")
    assert finished_under_load, "the benchmark ended before the rollout: not under load"
    assert (steady["completed"], steady["failed"]) == (STEADY.num_prompts, 0), steady["errors"]
    assert not trickle.failed(), trickle.failed()
    verdicts = [a["verdict"] for a in done["analyses"]]
    assert "inconclusive" in verdicts and "pass" in verdicts, verdicts
    assert stack.deployment()["revision"]["number"] == green


def writes_under(pid: int, directory: Path) -> bool:
    """Whether process ``pid``'s standard output is a file under ``directory``."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1").startswith(f"{directory}/")
    except FileNotFoundError:  # it exited since the scan: not a leftover
        return False


def _process(stack: Stack, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    [process] = [p for p in stack.deployment()["processes"] if wanted(p)]
    return dict(process)


def test_a_killed_decode_leaves_requests_to_prefill_and_the_supervisor_starts_it_again(
        stack: Stack) -> None:
    """Not waited for until ready: the next test stops the deployment while this decode starts
    (a restarted worker serving again is the fault matrix's, tests/e2e/test_fault_matrix.py)."""
    # Green's decode: after the rollout, blue's stopped rows stay in the table without a pid.
    decode = _process(stack, lambda p: p["slot"] == "decode-0" and p["pid"] is not None)
    # Requests the router ran whole on prefill because decode was missing (any revision's).
    degraded_before = metric(stack.router, DEGRADED, {"missing_role": "decode"})
    os.killpg(decode["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # Degraded mode: with decode gone, prefill answers the whole request.
    response = httpx.post(f"{stack.router}/v1/chat/completions", timeout=30,
                          json={"model": "smollm2", "messages": QUESTION, "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]
    assert time.monotonic() - killed < 10
    assert metric(stack.router, DEGRADED, {"missing_role": "decode"}) == degraded_before + 1
    # Failed without a pid for its backoff (a second), then starting again in a new process.
    deadline = time.monotonic() + 60
    again = decode
    while time.monotonic() < deadline and again["pid"] in (None, decode["pid"]):
        time.sleep(0.5)
        again = _process(stack, lambda p: p["id"] == decode["id"])
    assert again["pid"] not in (None, decode["pid"]), again
    assert again["restarts"] == decode["restarts"] + 1 and again["state"] == "starting", again


def test_stop_leaves_no_vllm_process(stack: Stack) -> None:
    # The stop comes while decode starts again (the test before): nothing of it may be left.
    pids = {p["pid"] for p in stack.deployment()["processes"] if p["pid"] is not None}
    with stack.api() as client:
        assert client.post(f"/api/v1/deployments/{stack.deployment_id}/stop").status_code == 202
    body = stack.wait_for_state("stopped", timeout_s=60)
    assert all(p["state"] == "stopped" for p in body["processes"])
    # This stack's processes are those writing their output under its data directory (the
    # supervisor opens each child's log there; vLLM's engine processes inherit it). Other
    # consoles run beside this one (the borrowed deployment, the console suite's routers):
    # their processes are not this stop's leftovers.
    leftovers = [
        proc.info for proc in psutil.process_iter(["pid", "cmdline"])
        if any("vllm" in part or "inference.router" in part for part in proc.info["cmdline"] or [])
        and writes_under(proc.info["pid"], stack.data_dir)
    ]
    assert leftovers == []
    assert not any(psutil.pid_exists(pid) for pid in pids)

