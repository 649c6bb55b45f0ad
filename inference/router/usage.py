"""Usage metering: every request the router serves, counted per (UTC day, API key id) in a ledger
that outlives the router (``--usage-file``, SQLite) and that the console reads through
``GET /admin/usage``.

A request adds to the counts of the day its answer ended, under its key's id ("" without a key:
an open deployment, or the legacy ``PDSERVE_API_KEY``): ``requests``, ``errors`` (answered
>= 400, or a stream that ended with an error event, broke off or lost its client),
``prompt_tokens``, ``completion_tokens`` and ``latency_ms_sum`` (arrival to the end of the answer).

The request path only adds to a dict of deltas in memory; a background task writes them every
0.5 s, in one transaction, off the event loop. So a SIGKILL loses at most the last interval; a
graceful stop (SIGTERM, the app's cleanup) writes what is left before the router exits. A write
that fails (disk full, the file locked) keeps its deltas for the next one. Several routers may
share one file: each write is an upsert that adds, inside SQLite's own locking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("pdserve.router.usage")

FLAG = "--usage-file"
FLUSH_INTERVAL_S = 0.5
SCHEMA_VERSION = 1
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens", "latency_ms_sum")

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    day TEXT NOT NULL,
    key TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    latency_ms_sum REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (day, key)
) WITHOUT ROWID
"""
# Adds to the row rather than replacing it: other routers may write the same file.
UPSERT = """
INSERT INTO usage (day, key, requests, errors, prompt_tokens, completion_tokens, latency_ms_sum)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, key) DO UPDATE SET
    requests = requests + excluded.requests,
    errors = errors + excluded.errors,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum
"""
SELECT = ("SELECT day, key, requests, errors, prompt_tokens, completion_tokens, latency_ms_sum "
          "FROM usage WHERE day >= ?")
SELECT_TOKENS = "SELECT day, key, prompt_tokens + completion_tokens FROM usage WHERE day >= ?"

Slot = tuple[str, str]  # (day, key id)


class UsageUnavailable(Exception):
    """The ledger file could not be read."""


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_sum: float = 0.0

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_ms_sum += other.latency_ms_sum



def check_day(value: str) -> str:
    """``value`` if it is a day as the ledger writes it (YYYY-MM-DD); else ValueError."""
    if not DAY.fullmatch(value):
        raise ValueError(f"'since' must be a day as YYYY-MM-DD, got {value!r}")
    try:
        time.strptime(value, "%Y-%m-%d")
    except ValueError:
        raise ValueError(f"'since' is not a date: {value!r}") from None
    return value


def open_ledger(path: str | None, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A connection to the ledger in ``path`` (created, with its directory, if missing; mode
    0600), or to one in memory. ValueError naming --usage-file if it cannot be used."""
    if path is not None:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Created here rather than by SQLite so that it is never readable by others, not even
            # for a moment; SQLite gives its -wal and -shm files the same mode.
            os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        except OSError as exc:
            raise ValueError(f"{FLAG}: cannot create {path}: {exc.strerror or exc}") from exc
    try:
        # Autocommit: each write opens its own transaction (BEGIN IMMEDIATE). Used from the
        # ledger's write thread and the loop's, one at a time under the ledger's lock.
        db = sqlite3.connect(path or ":memory:", timeout=busy_timeout_s, isolation_level=None,
                             check_same_thread=False)
    except sqlite3.Error as exc:
        raise ValueError(f"{FLAG}: cannot open {path}: {exc}") from exc
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ValueError(f"{FLAG}: {path} was written by a newer router (schema version "
                             f"{version}, this one knows {SCHEMA_VERSION})")
        # WAL: the console and other routers read while this one writes. NORMAL: a power cut
        # may lose the last transactions but never corrupts the file, and a commit costs no
        # fsync.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except (sqlite3.Error, ValueError) as exc:
        db.close()
        if isinstance(exc, ValueError):
            raise
        raise ValueError(f"{FLAG}: {path} is not a usable usage ledger: {exc}") from exc
    return db


def check_usage_file(path: str) -> None:
    """The config check of --usage-file: the router refuses to start on a path it cannot use."""
    open_ledger(path).close()


@dataclass
class UsageLedger:
    """Counts per (UTC day, key id): deltas in memory, written to SQLite every interval."""

    path: str | None = None
    flush_interval_s: float = FLUSH_INTERVAL_S
    busy_timeout_s: float = 5.0
    clock: Callable[[], float] = time.time
    _db: sqlite3.Connection = field(init=False, repr=False)
    # One write or read of the file at a time, each in a thread: no write can land between a
    # read and the look at the pending deltas that completes it.
    _file: asyncio.Lock = field(init=False, repr=False, default_factory=asyncio.Lock)
    _pending: dict[Slot, Counts] = field(init=False, repr=False, default_factory=dict)
    _task: asyncio.Task[None] | None = field(init=False, repr=False, default=None)
    _stop: asyncio.Event | None = field(init=False, repr=False, default=None)
    _failed_flushes: int = field(init=False, repr=False, default=0)
    _day_number: int = field(init=False, repr=False, default=-1)
    _day: str = field(init=False, repr=False, default="")

    def __post_init__(self) -> None:
        self._db = open_ledger(self.path, self.busy_timeout_s)

    # ---- the request path ---------------------------------------------------------------
    def record(self, key: str, failed: bool, prompt_tokens: int, completion_tokens: int,
               latency_ms: float) -> None:
        """Count one request that has ended; ``key``: its key's id, "" without one."""
        # hot path: runs once per request; never touches the file
        slot = (self.today(), key)
        counts = self._pending.get(slot)
        if counts is None:
            counts = self._pending[slot] = Counts()
        counts.requests += 1
        counts.errors += failed
        counts.prompt_tokens += prompt_tokens
        counts.completion_tokens += completion_tokens
        counts.latency_ms_sum += latency_ms

    def today(self) -> str:
        # Unix time has no leap seconds: every UTC day is 86,400 of its seconds, so the date
        # string is made once a day rather than per request.
        number = int(self.clock() // 86400)
        if number != self._day_number:
            self._day_number = number
            self._day = time.strftime("%Y-%m-%d", time.gmtime(number * 86400))
        return self._day

    # ---- writing ------------------------------------------------------------------------
    def start(self) -> None:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._flush_forever())
        self._task.add_done_callback(_report_crash)

    async def _flush_forever(self) -> None:
        assert self._stop is not None
        while True:
            stopping = False
            # Waiting for the interval to pass, or for close() to end the loop sooner.
            with contextlib.suppress(TimeoutError):
                stopping = await asyncio.wait_for(self._stop.wait(), self.flush_interval_s)
            await self.flush()
            if stopping:
                return

    async def flush(self) -> bool:
        """Write the pending deltas in one transaction, in a thread. Returns False if that
        failed; the deltas are then kept for the next flush."""
        # Shielded: a write under way ends, and its deltas are settled (written or kept),
        # whatever cancels the caller.
        return await asyncio.shield(self._flush())

    async def _flush(self) -> bool:
        async with self._file:
            if not self._pending:
                return True
            deltas, self._pending = self._pending, {}
            try:
                await asyncio.to_thread(self._write, deltas)
            except sqlite3.Error as exc:
                self._keep(deltas)
                self._failed_flushes += 1
                if self._failed_flushes == 1:  # one warning per outage, not one per interval
                    log.warning("usage ledger %s: cannot write (%s); the counts are kept in "
                                "memory and written once it can", self.path or "(memory)", exc)
                return False
        if self._failed_flushes:
            log.info("usage ledger %s written again after %d failed flushes",
                     self.path or "(memory)", self._failed_flushes)
            self._failed_flushes = 0
        return True

    def _write(self, deltas: dict[Slot, Counts]) -> None:
        rows = [(day, key, c.requests, c.errors, c.prompt_tokens, c.completion_tokens,
                 c.latency_ms_sum) for (day, key), c in deltas.items()]
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(UPSERT, rows)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _keep(self, deltas: dict[Slot, Counts]) -> None:
        """Put deltas that did not reach the file back with those recorded meanwhile."""
        for slot, counts in deltas.items():
            self._pending.setdefault(slot, Counts()).add(counts)

    async def close(self) -> None:
        """Stop the flush task after its last flush, then write what is left on the loop:
        nothing else runs any more when the router's cleanup calls this."""
        try:
            if self._task is not None and self._stop is not None:
                self._stop.set()
                await self._task
        finally:
            async with self._file:  # a write or read still in its thread ends first
                self._write_left()
                self._db.close()

    def _write_left(self) -> None:
        if not self._pending:
            return
        deltas, self._pending = self._pending, {}
        try:
            self._write(deltas)
        except sqlite3.Error as exc:
            self._pending = deltas
            log.error("usage ledger %s: cannot write at shutdown (%s); the usage of %d requests "
                      "is lost", self.path or "(memory)", exc,
                      sum(c.requests for c in deltas.values()))

    # ---- reading ------------------------------------------------------------------------
    async def rows(self, since: str | None = None) -> list[dict[str, Any]]:
        """Cumulative counts per (day, key), what the file holds plus what is not written yet,
        sorted by day then key; only days >= ``since`` if given. Raises UsageUnavailable."""
        # Shielded: a caller that leaves must not free the file while its read is under way.
        return await asyncio.shield(self._rows(since))

    async def _rows(self, since: str | None) -> list[dict[str, Any]]:
        async with self._file:
            try:
                stored = await asyncio.to_thread(self._read, since or "")
            except sqlite3.Error as exc:
                raise UsageUnavailable(f"the usage ledger cannot be read: {exc}") from exc
            # No write since the read: what the file lacks is exactly what is pending now.
            totals = {(day, key): Counts(*counts) for day, key, *counts in stored}
            for slot, counts in self._pending.items():
                if since is None or slot[0] >= since:
                    totals.setdefault(slot, Counts()).add(counts)
        return [{"day": day, "key": key, "requests": c.requests, "errors": c.errors,
                 "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                 "latency_ms_sum": round(c.latency_ms_sum, 3)}
                for (day, key), c in sorted(totals.items())]

    def _read(self, since: str) -> list[tuple[Any, ...]]:
        return self._db.execute(SELECT, (since,)).fetchall()

    def token_totals(self, since: str) -> list[tuple[str, str, int]]:
        """(day, key id, prompt + completion tokens) of the days >= ``since``, what the file
        holds plus what is pending: the token budgets start from it (budgets.py). Reads on the
        caller's thread, so only before the router serves. ValueError naming --usage-file if
        the file cannot be read: a router must not start with budgets it cannot count."""
        try:
            stored = self._db.execute(SELECT_TOKENS, (since,)).fetchall()
        except sqlite3.Error as exc:
            raise ValueError(f"{FLAG}: {self.path} cannot be read: {exc}") from exc
        pending = [(day, key, c.prompt_tokens + c.completion_tokens)
                   for (day, key), c in self._pending.items() if day >= since]
        return [*stored, *pending]


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("usage ledger: the flush task stopped; counts stay in memory until shutdown",
                  exc_info=exc)
