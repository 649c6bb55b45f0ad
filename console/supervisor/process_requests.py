"""Asking the supervisor for a process: a gate's reference server, a measurement's vLLM server,
a quantization builder. Nothing but the supervisor spawns a process; everyone else writes the
row, waits for it, and lets it go.

The row names its requester (pid and start time). The supervisor stops a requested process
whose requester is gone, so a Celery worker killed mid-task leaves no server running.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psutil
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.supervisor.models import ManagedProcess

State = ManagedProcess.State
# The supervisor ticks every half second: a request not taken within this has nobody to take it.
PICKUP_TIMEOUT_S = 30.0
POLL_S = 0.25


class ProcessFailed(RuntimeError):
    """The requested process did not become ready, or stopped before it was released."""


def this_process() -> tuple[int, datetime]:
    """The requester's identity as the supervisor checks it: pid and start time."""
    pid = os.getpid()
    started = psutil.Process(pid).create_time()
    return pid, datetime.fromtimestamp(started, tz=timezone.get_current_timezone())


def request(kind: str, slot: str, argv: list[str], env: dict[str, str], log_path: Path,
            port: int | None, role: str = "colocated") -> ManagedProcess:
    """Record a request; the supervisor spawns it on its next tick. A slot used before (by an
    earlier run of the same job) is taken over once that run's process is gone."""
    owner_pid, owner_started_at = this_process()
    fields = {"kind": kind, "role": role, "port": port, "command": argv, "env": env,
              "log_path": str(log_path), "wanted": ManagedProcess.Wanted.RUNNING,
              "state": State.STOPPED, "pid": None, "started_at": None, "ready_at": None,
              "exit_code": None, "last_error": "", "owner_pid": owner_pid,
              "owner_started_at": owner_started_at}
    try:
        with transaction.atomic():
            # No ordering: the table's default joins deployments, which FOR UPDATE cannot lock.
            previous = ManagedProcess.objects.select_for_update().filter(
                deployment=None, slot=slot).order_by().first()
            if previous is None:
                return ManagedProcess.objects.create(deployment=None, slot=slot, **fields)
            pending = previous.wanted == ManagedProcess.Wanted.RUNNING and previous.started_at is None
            if previous.state in ManagedProcess.ALIVE_STATES or pending:
                raise ProcessFailed(f"{slot} is still {'running' if previous.pid else 'requested'} "
                                    f"(pid {previous.pid or '-'}, requested by pid {previous.owner_pid})")
            for name, value in fields.items():
                setattr(previous, name, value)
            previous.save()
            return previous
    except IntegrityError as exc:  # another requester created the slot in between
        raise ProcessFailed(f"{slot} is being requested by another process") from exc


def ended(record: ManagedProcess) -> bool:
    """Whether the supervisor started the process and recorded its end. Not ``pid is None``
    alone: the supervisor marks the row started (``starting``, no pid yet) before it spawns,
    and a builder's loop that polled in between concluded a job whose builder then ran on."""
    return (record.started_at is not None and record.pid is None
            and record.state in (State.STOPPED, State.FAILED))


def wait_until(record: ManagedProcess, ready: bool, timeout_s: float) -> ManagedProcess:
    """Wait until the supervisor reports the process ready (``ready``) or ended; raise
    :class:`ProcessFailed` with the supervisor's reason when it ends otherwise than wanted."""
    picked_up_by = time.monotonic() + PICKUP_TIMEOUT_S
    deadline = time.monotonic() + timeout_s
    while True:
        record.refresh_from_db()
        if ready and record.state == State.READY:
            return record
        if record.state == State.FAILED:
            raise ProcessFailed(f"{record.slot} failed: {record.last_error}")
        if record.state == State.STOPPED and record.started_at is not None:
            if ready:
                raise ProcessFailed(f"{record.slot} exited with code {record.exit_code} "
                                    "before it was ready")
            return record
        if record.started_at is None and time.monotonic() > picked_up_by:
            raise ProcessFailed(f"no supervisor started {record.slot} within "
                                f"{PICKUP_TIMEOUT_S:.0f} s; is `manage.py supervise` running?")
        if time.monotonic() > deadline:
            raise ProcessFailed(f"{record.slot} was not {'ready' if ready else 'done'} within "
                                f"{timeout_s:.0f} s (log: {record.log_path})")
        time.sleep(POLL_S)


def release(record: ManagedProcess, timeout_s: float = 40.0) -> None:
    """Ask the supervisor to stop the process, and wait until it has (its grace and then some)."""
    ManagedProcess.objects.filter(pk=record.pk, wanted=ManagedProcess.Wanted.RUNNING).update(
        wanted=ManagedProcess.Wanted.STOPPED, updated=timezone.now())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record.refresh_from_db()
        # Not started (the engine takes only a row still wanted), or started and gone.
        if record.state not in ManagedProcess.ALIVE_STATES:
            return
        time.sleep(POLL_S)
    raise ProcessFailed(f"{record.slot} was still running {timeout_s:.0f} s after its release")


@contextmanager
def supervised(kind: str, slot: str, argv: list[str], env: dict[str, str], log_path: Path,
               port: int | None, timeout_s: float) -> Iterator[ManagedProcess]:
    """A requested process, ready, for the duration of the ``with`` block."""
    record = request(kind, slot, argv, env, log_path, port)
    try:
        yield wait_until(record, ready=True, timeout_s=timeout_s)
    finally:
        release(record)
