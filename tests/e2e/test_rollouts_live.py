"""Rollouts on a real deployment: the session's tiny-model 1P1D (tests/borrowed.py) under a load
that never pauses, through a canary rollout (with its supervisor SIGKILLed mid-rollout) and a
one-click rollback (a blue-green rollout of the previous revision). A green that fails its output
gate is tested in tests/console/test_rollout_analysis_live.py (a gate's reference server and a
third green start took this test past 20 minutes on a loaded 2-core machine).

The two revisions run different random-weight models (tests/tiny_llama.py: the shared tiny model,
and one with untied output embeddings and another seed), so their greedy answers differ: an
answer names its revision (``X-Pdserve-Revision``) and must be that revision's text, which a
prefill of one revision paired with a decode of another would not give.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
import pytest

from tests.borrowed import FACILITY, SMOLLM2, Handle
from tests.e2e.fault_harness import up_child, wait_for
from tests.tiny_llama import SHARED_TINY, build_tiny_llama

pytestmark = pytest.mark.vllm

PROMPT = "The capital of France is the city of"
ROLLOUT_TIMEOUT_S = 600.0
# Between one client's requests while green starts (Load.paced). Over a second between requests
# at each worker: vLLM's workers busy-poll their queue for a second after each step
# (shm_broadcast's SpinCondition), and green's worker process, pinned to blue's core, got 4.5 %
# of it while blue spun (its start then took over 10 minutes).
STARTING_PACE_S = 3.0
# Short steps, holds and windows: the test proves the machine, not the defaults.
CANARY = {"steps": [{"weight": 30, "hold_s": 6}, {"weight": 100, "hold_s": 0}],
          "analysis": {"interval_s": 3, "failure_limit": 3, "min_requests": 3,
                       "metrics": {"error_rate": {"max": 0.0}, "handoff_failure_rate": {"max": 0.0},
                                   "ttft_p95": {"max_ratio": 20}}},
          "scale_down_delay_s": 4, "drain_timeout_s": 60}


@dataclass
class Load:
    """Clients that send completions one after another; every answer is kept.

    While green's workers start, each client waits ``pace_s`` between requests: requests keep
    flowing through blue, but the two cores go to vLLM's start (at full load one green start
    took over 5 minutes here, and one in CI went past the rollout's 10-minute limit). The load
    is full again once green serves (``full()``), through every weight change and the drain.
    """

    router: str
    model: str
    answers: list[tuple[int, str, str, str]] = field(default_factory=list)  # status, rev, text, err
    stop: threading.Event = field(default_factory=threading.Event)
    pace_s: float = 0.0

    def paced(self) -> None:
        self.pace_s = STARTING_PACE_S

    def full(self) -> None:
        self.pace_s = 0.0

    def run(self, session: str | None, stream: bool) -> None:
        """Send requests until told to stop; streamed ones count an SSE error event as a
        failure (the router's way to fail a stream that had begun)."""
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                headers = {"X-Session-Id": session} if session else {}
                body = {"model": self.model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                        "stream": stream}
                try:
                    with client.stream("POST", f"{self.router}/v1/completions", headers=headers,
                                       json=body) as response:
                        raw = response.read().decode()
                except httpx.HTTPError as exc:
                    self.answers.append((0, "", "", repr(exc)))
                    continue
                revisions = ",".join(response.headers.get_list("X-Pdserve-Revision"))
                if response.status_code != 200:
                    self.answers.append((response.status_code, revisions, "", raw[:300]))
                    continue
                text, error = _text(raw, stream)
                self.answers.append((599 if error else 200, revisions, text, error))
                if self.pace_s:
                    self.stop.wait(self.pace_s)

    def since(self, index: int) -> list[tuple[int, str, str, str]]:
        return self.answers[index:]


def _text(raw: str, stream: bool) -> tuple[str, str]:
    """The answer's text, and an error event's body when a stream carried one."""
    if not stream:
        return json.loads(raw)["choices"][0]["text"], ""
    text = []
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        if "error" in event:
            return "".join(text), line
        text.append(event["choices"][0]["text"])
    return "".join(text), ""


@pytest.fixture
def load(borrowed: Handle) -> Iterator[Load]:
    load = Load(borrowed.router, borrowed.served_model_name)
    # Streams: TTFT, ITL and TPOT are measured on streamed answers. Two clients keep both cores
    # busy; more made each green start take over 4 minutes here.
    threads = [threading.Thread(target=load.run, args=(session, stream), daemon=True)
               for session, stream in ((None, True), ("sticky-session", False))]
    for thread in threads:
        thread.start()
    yield load
    load.stop.set()
    for thread in threads:
        thread.join(timeout=130)


def _rollout(handle: Handle, revision: int, strategy: str, **options: Any) -> dict[str, Any]:
    response = handle.call("POST", "/api/v1/rollouts/", json={
        "deployment": handle.deployment_id, "revision": revision, "strategy": strategy,
        **options})
    assert response.status_code == 201, response.text
    return response.json()


def _finish(handle: Handle, rollout_id: int, wanted: str, load: Load,
            during: Any = None) -> dict[str, Any]:
    """Wait for the rollout to end, with the load paced until green's workers are up;
    ``during(rollout)`` is called on each poll."""
    deadline = time.monotonic() + ROLLOUT_TIMEOUT_S
    while True:
        body = _quiet_get(handle, f"/api/v1/rollouts/{rollout_id}/")
        if body is not None:
            if body["state"] != "starting":
                load.full()
            if during is not None:
                during(body)
            if body["state"] in ("succeeded", "rolled_back"):
                assert body["state"] == wanted, (body["reason"], body["transitions"])
                return body
        assert time.monotonic() < deadline, f"rollout #{rollout_id} not done: {body}"
        time.sleep(0.5)


def _quiet_get(handle: Handle, path: str) -> dict[str, Any] | None:
    try:
        response = handle.call("GET", path)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _memory() -> int:
    """Resident memory of every process of the borrowed deployment, in bytes."""
    total = 0
    for pid in FACILITY.pids():
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def _draft(handle: Handle, **body: Any) -> int:
    response = handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/revisions/",
                           json=body)
    assert response.status_code == 201, response.text
    return response.json()["number"]


def _check(answers: list[tuple[int, str, str, str]], texts: dict[str, str]) -> Counter[str]:
    """Every answer a 200 naming one revision, with that revision's text."""
    failed = [a for a in answers if a[0] != 200]
    assert not failed, f"{len(failed)} of {len(answers)} requests failed: {failed[:5]}"
    by_revision: Counter[str] = Counter()
    for _, revision, text, _ in answers:
        assert revision and "," not in revision, f"an answer names {revision!r}"
        if revision in texts:
            assert text == texts[revision], (revision, text, texts)
        else:
            texts[revision] = text
        by_revision[revision] += 1
    return by_revision


def test_canary_and_a_blue_green_rollback_lose_nothing_and_never_mix_revisions(
        borrowed: Handle, load: Load) -> None:
    live = borrowed.deployment()
    other = build_tiny_llama(SMOLLM2, SHARED_TINY.parent / "tiny-llama-2l-untied", seed=1,
                             tied=False)
    registered = borrowed.call("POST", "/api/v1/variants/", json={
        "base_model": "tiny", "name": "f32-untied", "path": str(other)})
    assert registered.status_code in (201, 400), registered.text
    texts: dict[str, str] = {}
    wait_for(lambda: len(load.answers) >= 10, "the load's first answers", 60)
    first = live["revision"]["number"] if live.get("revision") else 1

    # 1. Canary to the other model; the supervisor is SIGKILLed while green takes 30%.
    green = _draft(borrowed, variants={"prefill": "tiny/f32-untied", "decode": "tiny/f32-untied"},
                   gate={"mode": "off"}, note="the untied model")
    start = len(load.answers)
    load.paced()
    rollout = _rollout(borrowed, green, "canary", **CANARY)
    killed: list[float] = []

    def kill_supervisor_once(body: dict[str, Any]) -> None:
        if not killed and body["state"] == "stepping" and body["weights"].get(str(green)) == 30:
            up_child("manage.py supervise").kill()
            killed.append(time.monotonic())

    peak: list[int] = [_memory()]

    def during(body: dict[str, Any]) -> None:
        kill_supervisor_once(body)
        peak[0] = max(peak[0], _memory())

    before = peak[0]
    canary = _finish(borrowed, rollout["id"], "succeeded", load, during=during)
    assert killed, "the canary never held green at 30%"
    served = _check(load.since(start), texts)
    assert served[str(first)] and served[str(green)], served
    assert texts[str(first)] != texts[str(green)], "the two models answer alike"
    states = [t["to_state"] for t in canary["transitions"]]
    assert states[:2] == ["starting", "stepping"] and states[-3:] == ["warm", "draining",
                                                                       "succeeded"], states
    assert any(a["verdict"] == "pass" for a in canary["analyses"]), canary["analyses"]
    print(f"\ncanary r{first} -> r{green}: {served} (supervisor SIGKILLed mid-rollout); "
          f"RSS of the console, workers and router: {before / 2**30:.2f} GiB before, "
          f"{peak[0] / 2**30:.2f} GiB at most with both colours")
    for row in canary["transitions"]:
        print(f"  {row['at']} {row['from_state']} -> {row['to_state']} {row['weights']}")

    # 2. One click: back to the previous revision, blue-green.
    start = len(load.answers)
    load.paced()
    back = borrowed.call("POST", f"/api/v1/deployments/{borrowed.deployment_id}/rollback/")
    assert back.status_code == 201, back.text
    assert (back.json()["to_revision"], back.json()["strategy"]) == (first, "blue_green")
    _finish(borrowed, back.json()["id"], "succeeded", load)
    served = _check(load.since(start), texts)
    assert served[str(first)], served
    print(f"rollback (blue-green) r{green} -> r{first}: {served}")
    assert borrowed.deployment()["revision"]["number"] == first
