"""The session's borrowed tiny-model deployment (tests/borrowed.py) is put back clean.

Two borrowers in file order: the first gets it ready, has a completion answered through the
router and SIGKILLs a worker; the second finds the same deployment ready again, the worker
restarted by the supervisor, and completions answered. Run alone, the second test still checks
what any borrower is promised.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.borrowed import FACILITY, Handle
from tests.borrowed_plan import current_processes, plan_body, plan_of
from tests.vllm_starts import engine_processes

pytestmark = pytest.mark.vllm

# What the first borrower left, for the second to compare.
FIRST: dict[str, Any] = {}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_first_borrower_gets_it_ready_and_kills_a_worker(borrowed: Handle) -> None:
    body = borrowed.deployment()
    assert body["state"] == "ready"
    processes = current_processes(body)
    assert set(processes) == {"prefill-0", "decode-0", "router"}
    assert httpx.get(f"{borrowed.router}/health", timeout=10).json()["status"] == "ok"

    answer = borrowed.complete(max_tokens=8, ignore_eos=True)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8

    decode = processes["decode-0"]
    os.kill(decode["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not _gone(decode["pid"]):
        assert time.monotonic() < deadline, f"decode-0 (pid {decode['pid']}) outlived SIGKILL"
        time.sleep(0.1)
    FIRST.update(deployment_id=borrowed.deployment_id, killed=decode["pid"],
                 restarts=decode["restarts"], workers=body["workers"])


def test_the_next_borrower_finds_it_ready_again(borrowed: Handle) -> None:
    # Ready as it is handed over: no waiting here.
    body = borrowed.deployment()
    assert body["state"] == "ready", body
    processes = current_processes(body)
    assert set(processes) == {"prefill-0", "decode-0", "router"}
    assert all(p["state"] == "ready" and psutil.pid_exists(p["pid"]) for p in processes.values())
    health = httpx.get(f"{borrowed.router}/health", timeout=10).json()
    assert health["roles"]["prefill"]["ready"] == 1 and health["roles"]["decode"]["ready"] == 1
    if FIRST:
        assert borrowed.deployment_id == FIRST["deployment_id"]
        assert body["workers"] == FIRST["workers"]
        assert processes["decode-0"]["pid"] != FIRST["killed"]
        assert processes["decode-0"]["restarts"] == FIRST["restarts"] + 1

    for _ in range(3):
        answer = borrowed.complete(max_tokens=8, ignore_eos=True)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8

    # A restarted worker too: two interpreters per worker (API server and engine core, the
    # model in the latter), every thread of the server on the worker's core.
    for slot, core in (("prefill-0", "0"), ("decode-0", "1")):
        engines = engine_processes(processes[slot]["pid"])
        assert [e.name() for e in engines] == ["VLLM::EngineCore"], (slot, engines)
        for process in (psutil.Process(processes[slot]["pid"]), *engines):
            assert _allowed_cores(process) == {core}, (slot, process.name())


def _allowed_cores(process: psutil.Process) -> set[str]:
    """The cores each of a process's threads may run on, as the kernel holds them."""
    allowed = set()
    for thread in process.threads():
        try:
            status = Path(f"/proc/{process.pid}/task/{thread.id}/status").read_text()
        except FileNotFoundError:  # the thread ended since the listing
            continue
        allowed.add(status.split("Cpus_allowed_list:")[1].split()[0])
    return allowed


def test_the_plan_put_back_restores_is_one_the_api_takes(borrowed: Handle) -> None:
    # Put-back writes the original plan again after a borrower changed it: its write form must
    # stay what the API takes (checked here without a restart; put-back checks the result).
    assert plan_of(borrowed.deployment()) == FACILITY.plan
    response = borrowed.call("POST", f"/api/v1/deployments/{borrowed.deployment_id}/check",
                             json=plan_body(FACILITY.plan))
    assert response.status_code == 200, response.text
    assert response.json()["ok"], response.json()
