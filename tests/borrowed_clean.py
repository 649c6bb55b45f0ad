"""When a borrowed deployment is clean (tests/borrowed.py): every planned process ready and alive,
no unplanned one left running, the router healthy and a completion answered. The wait for it,
and what a borrower's test prints when it is not reached: each process's state and log tail."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from tests.borrowed_plan import planned_slots

# How long the console may still call clean processes something other than ready.
STATE_GRACE_S = 30.0


class BorrowError(AssertionError):
    """The deployment could not be started, or not put back clean."""


class CleanHandle(Protocol):
    """What the wait needs of a borrowed deployment's handle (tests/borrowed.py's Handle)."""

    router: str

    def deployment(self) -> dict[str, Any]: ...

    def processes(self) -> dict[str, dict[str, Any]]: ...

    def complete(self, prompt: str = ..., max_tokens: int = ..., **body: Any) -> httpx.Response: ...

    def log(self, slot: str) -> Path: ...


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_clean(handle: CleanHandle, doing: str, timeout_s: float) -> None:
    """Until the deployment is clean and the console says ``ready``; a BorrowError naming what
    ``doing`` left unclean after ``timeout_s``, or sooner when only the console's word stays
    wrong."""
    deadline = time.monotonic() + timeout_s
    settled_at: float | None = None  # since when only the console's word is wrong
    while True:
        state, found = problems(handle)
        now = time.monotonic()
        if state == "ready" and not found:
            return
        if found:
            settled_at = None
        else:
            settled_at = settled_at or now
            if now - settled_at > STATE_GRACE_S:
                body = handle.deployment()
                planned = planned_slots(body)
                stale = [f"{p['slot']} {p['state']}" for p in body["processes"]
                         if p["slot"] not in planned]
                raise BorrowError(
                    f"{doing}: every planned process is ready and a completion answered, but "
                    f"the console's state stays {state!r} (rows of unplanned slots: "
                    f"{', '.join(stale) or 'none'})\n{diagnosis(handle)}")
        if now > deadline:
            found = found or [f"state {state}"]
            raise BorrowError(f"{doing}: not clean after {timeout_s:.0f} s: "
                              f"{'; '.join(found)}\n{diagnosis(handle)}")
        time.sleep(1)


def problems(handle: CleanHandle) -> tuple[str, list[str]]:
    """The console's word for the deployment, and what keeps its processes from clean: every
    planned one ready and alive, the router healthy, a completion answered."""
    body = handle.deployment()
    found = [] if body["desired_state"] == "running" else [
        f"desired state {body['desired_state']}"]
    processes = {p["slot"]: p for p in body["processes"]}
    planned = planned_slots(body)
    for slot in sorted(planned | set(processes)):
        process = processes.get(slot)
        if process is None:
            found.append(f"{slot}: no process")
        elif slot not in planned:
            if process["state"] != "stopped":  # left by a plan that had it: must stop
                found.append(f"{slot} (not planned) {process['state']}")
        elif process["state"] != "ready":
            found.append(f"{slot} {process['state']} {process['last_error']}".strip())
        elif not alive(process["pid"]):
            found.append(f"{slot}: pid {process['pid']} is gone")
    if found:
        return body["state"], found
    try:
        health = httpx.get(f"{handle.router}/health", timeout=5)
        # "degraded" is a 200 too, but not clean: one role is serving without the other.
        if health.status_code != 200 or health.json().get("status") != "ok":
            return body["state"], [f"router /health {health.status_code}: {health.text[:300]}"]
        answer = handle.complete(prompt="Hello", max_tokens=2)
    except httpx.HTTPError as exc:
        return body["state"], [f"router: {exc!r}"]
    if answer.status_code != 200 or not answer.json().get("choices"):
        return body["state"], [f"completion {answer.status_code}: {answer.text[:300]}"]
    return body["state"], []


def diagnosis(handle: CleanHandle) -> str:
    lines = []
    for slot, process in handle.processes().items():
        lines.append(f"--- {slot}: {process['state']} pid {process['pid']} "
                     f"restarts {process['restarts']} {process['last_error']}")
        lines.append(tail(handle.log(slot)))
    return "\n".join(lines)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path}: {exc})"
