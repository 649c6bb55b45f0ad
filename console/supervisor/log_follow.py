"""Following a child's log file into the store's queue: children write their output straight
to the file (so it outlives a supervisor that dies), and a thread reads it line by line."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.utils import timezone

from console.supervisor.capture import CapturedLine, clean_line

log = logging.getLogger("pdserve.supervisor")

# How often a follower looks again at a file that has no new line yet.
FOLLOW_INTERVAL_S = 0.05


@dataclass
class LogFollow:
    """Where a log follower stops: at the file's size once the process group is gone (set by
    reap), so it reads every line the group wrote and none of a restarted process's."""

    path: Path
    done: threading.Event = field(default_factory=threading.Event)
    end: int = 0

    def finish(self) -> None:
        try:
            self.end = self.path.stat().st_size
        except OSError:
            self.end = 0  # the file is gone: nothing more to read
        self.done.set()


def follow_log(record_id: int, follow: LogFollow, offset: int,
           captured: queue.SimpleQueue[CapturedLine]) -> None:
    """Follow a child's log file from ``offset`` into the store's queue, line by line, until
    reap() says where its process group's output ends."""
    try:
        source = open(follow.path, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        log.warning("cannot follow %s (%s): its lines are in the file only", follow.path,
                    exc.strerror or exc)
        return
    with source:
        source.seek(offset)
        partial = b""
        while not follow.done.is_set():
            # hot path: runs once per line a worker prints
            raw = source.readline()
            if raw.endswith(b"\n"):
                captured.put(CapturedLine(record_id, clean_line(partial + raw),
                                               timezone.now()))
                partial = b""
                continue
            partial += raw
            time.sleep(FOLLOW_INTERVAL_S)
        # Up to where the group's output ended: a restarted process appends to the same file.
        rest = partial + source.read(max(0, follow.end - source.tell()))
    lines = rest.split(b"\n")
    for line in lines if lines[-1] else lines[:-1]:
        captured.put(CapturedLine(record_id, clean_line(line), timezone.now()))
