"""Process groups, the one way pdserve stops what it started.

Every child pdserve starts leads a process group of its own (``start_new_session``), so a stop
reaches the engine subprocesses vLLM forks too. A process is known again later, after a restart
of whoever started it, by its pid *and* start time: a pid alone may have been reused since.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import subprocess

import psutil

log = logging.getLogger("pdserve.processes")

# A record is written just after the spawn, so the process is a little older than it; and a
# process's start time is the kernel's boot time plus its age, and the boot time moves when the
# wall clock is corrected: in a VM that the host pauses, the wall clock jumps at resume. Seen in
# a fresh-clone make test: two workers' start times read 17 s and 21 s after the times their
# supervisor recorded (it logged them started before the kernel's clock said they were), so
# with 5 s the next supervisor took them for gone, started second copies on the same ports and
# left them orphaned. A pid taken by an unrelated process within two minutes of the recorded
# start is far less likely than such a jump.
START_TIME_TOLERANCE_S = 120.0


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
    return abs(started - started_at.timestamp()) < START_TIME_TOLERANCE_S


def kill_group(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send ``sig`` to the group ``pid`` leads; a group already gone is not an error."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        # Someone else's group (another user's process took the number): never ours to stop.
        log.warning("not allowed to signal process group %d (%s); leaving it", pid, sig.name)


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> int:
    """SIGTERM the group, SIGKILL it after ``grace_s``; return the leader's exit code. The group
    is killed once the leader is gone, so no engine subprocess outlives it."""
    kill_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    kill_group(process.pid, signal.SIGKILL)
    return process.wait()
