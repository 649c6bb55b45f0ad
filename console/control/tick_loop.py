"""The supervisor's loop of ticks, and what a database error in one tick does.

A tick that fails on the database (SQLite's "database is locked" past its busy timeout, a
PostgreSQL connection cut) used to end the daemon, and its ``finally`` stopped every worker and
router it owned: on `make up` under `vllm bench serve`, one write lock held too long by another
process took the whole deployment down and `up` started it again from nothing. The tick is a
reconciliation (it compares the process table with the children and acts on the difference), so
the next one picks up where a failed one stopped: the error is logged, the connection closed
(a cut one reconnects), and the loop goes on. Only when every tick has failed on the database
for ``grace_s`` does the error end the daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import Error as DatabaseError
from django.db import InterfaceError, OperationalError, connections

log = logging.getLogger("pdserve.supervisor")


def run_ticks(tick: Callable[[], object], stopping: Callable[[], bool], interval_s: float,
              grace_s: float, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """Call ``tick`` every ``interval_s`` until ``stopping()``. A tick that fails on the
    database is logged and the next one tried; failures on it for ``grace_s`` in a row raise
    the last error. Any other error raises at once."""
    failing_since: float | None = None
    while not stopping():
        try:
            tick()
        except (OperationalError, InterfaceError) as exc:
            now = clock()
            if failing_since is None:
                failing_since = now
            if now - failing_since >= grace_s:
                raise
            log.warning("a supervisor tick failed on the database (%s); the workers run on and "
                        "the next tick tries again (giving up after %.0f s of failures, %.0f s "
                        "so far)", exc, grace_s, now - failing_since)
            _close_connections()
        else:
            failing_since = None
        sleep(interval_s)


def _close_connections() -> None:
    """A connection left mid-transaction or cut is reopened by the next query."""
    for connection in connections.all(initialized_only=True):
        try:
            connection.close()
        except DatabaseError as exc:
            log.warning("closing the database connection after a failed tick failed too: %s",
                        exc)
