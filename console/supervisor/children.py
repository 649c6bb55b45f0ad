"""The supervisor's view of one child process: its handle (a Popen, or a process a previous
supervisor started and this one adopted), its log follower, and its restart backoff."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime

from console.supervisor.log_follow import LogFollow
from console.supervisor.models import ManagedProcess
from inference.process_groups import is_same_process

Kind = ManagedProcess.Kind


@dataclass
class Adopted:
    """A process a previous supervisor started and this one took over. Not this process's child,
    so its exit code cannot be read: it is known by pid and start time (a pid may be reused)."""

    pid: int
    started_at: datetime

    def alive(self) -> bool:
        return is_same_process(self.pid, self.started_at)


@dataclass
class Child:
    record_id: int
    deployment_id: int | None
    slot: str
    popen: subprocess.Popen[bytes] | Adopted
    capture: threading.Thread
    follow: LogFollow
    kind: str = Kind.WORKER
    stop_deadline: float | None = None
    next_probe: float = 0.0
    # Why it is being stopped when that is a failure (its requester vanished), else "".
    failure: str = ""
    # Its log's size when last looked at while starting, and when that size last changed.
    output_size: int = -1
    output_at: float = 0.0

    def ended(self) -> tuple[bool, int | None]:
        """Whether the process has exited, and its exit code when it is known."""
        if isinstance(self.popen, Adopted):
            return not self.popen.alive(), None
        code = self.popen.poll()
        return code is not None, code


@dataclass
class Backoff:
    failures: int = 0
    retry_at: float = 0.0
