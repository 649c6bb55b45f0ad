"""Process groups the supervisor started, known again after a restart by pid and start time
(a pid alone may have been reused by then)."""

from __future__ import annotations

import datetime
import os
import signal

import psutil


def is_same_process(pid: int | None, started_at: datetime.datetime | None) -> bool:
    """Whether ``pid`` is alive and still the process recorded as started at ``started_at``."""
    if not pid or started_at is None:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process.create_time()
    except psutil.NoSuchProcess:
        return False
    # The record is written just after the spawn, so the process is a little older than it.
    return abs(started - started_at.timestamp()) < 5.0


def kill_group(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
