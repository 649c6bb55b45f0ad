"""The supervisor's tick loop against database errors: a real SQLite file locked by another
connection past the busy timeout fails a tick; the loop goes on (the daemon's workers with it)
and gives up only after the grace (console/control/tick_loop.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from django.db import OperationalError
from django.db.backends.sqlite3.base import DatabaseWrapper

from console.control.tick_loop import run_ticks


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _locked_writer(path: Path) -> DatabaseWrapper:
    """A Django SQLite connection to ``path`` with a short busy timeout, as the supervisor's
    (IMMEDIATE transactions)."""
    wrapper = DatabaseWrapper({"NAME": str(path), "OPTIONS": {"timeout": 0.05,
                                                               "transaction_mode": "IMMEDIATE"},
                               "ENGINE": "django.db.backends.sqlite3", "TIME_ZONE": None,
                               "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False,
                               "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False, "TEST": {},
                               "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""}, "ticks")
    return wrapper


def test_ticks_failing_on_a_locked_database_go_on_until_it_is_free(transactional_db: None,
                                                                   tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (n INTEGER)")
    writer = _locked_writer(path)
    done: list[int] = []

    def tick() -> None:
        with writer.cursor() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        done.append(1)

    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    clock = Clock()
    ticks = 0

    def stopping() -> bool:
        nonlocal ticks
        ticks += 1
        if ticks == 5:
            holder.execute("COMMIT")  # the lock is given up after four failed ticks
        return len(done) == 2

    run_ticks(tick, stopping, 0.5, grace_s=60, clock=clock, sleep=clock.sleep)
    assert done == [1, 1] and ticks == 7
    writer.close()
    holder.close()


def test_ticks_failing_on_the_database_past_the_grace_end_the_loop(transactional_db: None,
                                                                  tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (n INTEGER)")
    holder.execute("BEGIN IMMEDIATE")
    writer = _locked_writer(path)
    clock = Clock()
    attempts: list[float] = []

    def tick() -> None:
        attempts.append(clock())
        with writer.cursor() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")

    with pytest.raises(OperationalError, match="database is locked"):
        run_ticks(tick, lambda: False, 0.5, grace_s=3, clock=clock, sleep=clock.sleep)
    assert attempts == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    holder.execute("ROLLBACK")
    writer.close()
    holder.close()


def test_any_other_error_in_a_tick_ends_the_loop_at_once() -> None:
    calls: list[int] = []

    def tick() -> None:
        calls.append(1)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        run_ticks(tick, lambda: False, 0.5, grace_s=60, sleep=lambda _s: None)
    assert calls == [1]
