"""A loop in a thread of its own, for the supervisor's periodic work (the metrics collector,
the alert evaluator, the autoscaler): one step every interval, counted from start to start; a
step that raises is logged and the loop goes on (a locked database must not end the work);
the thread's database connection is closed when it ends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection


class Periodic:
    def __init__(self, name: str, interval_s: float, step: Callable[[], object],
                 log: logging.Logger, failed: str,
                 finish: Callable[[], None] | None = None) -> None:
        """``failed`` is the log message of a step that raised; ``finish`` runs in the thread
        after the last step (a lease given back, a client closed)."""
        self.name = name
        self.interval_s = interval_s
        self._step = step
        self._log = log
        self._failed = failed
        self._finish = finish
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self._step()
                except Exception:
                    self._log.exception(self._failed)
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
            if self._finish is not None:
                self._finish()
        finally:
            connection.close()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=timeout_s)
            self._thread = None
