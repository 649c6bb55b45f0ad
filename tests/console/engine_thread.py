"""The supervisor's process engine ticking in a thread of the test process, for code that asks
it for a process and waits (a Celery task run in the test). Needs ``transactional_db``: the
engine's thread has a database connection of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from console.supervisor.engine import ProcessEngine


@pytest.fixture
def running_engine(transactional_db: None, tmp_path: Path) -> Iterator[ProcessEngine]:
    engine = ProcessEngine(log_dir=tmp_path / "logs")
    stop = threading.Event()
    failures: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                engine.step()
                stop.wait(0.1)
        except BaseException as exc:  # the test fails on it below, with the traceback
            failures.append(exc)
            raise
        finally:
            engine.stop_children(grace_s=2.0)
            connection.close()

    thread = threading.Thread(target=loop, name="engine", daemon=True)
    thread.start()
    yield engine
    stop.set()
    thread.join(timeout=30)
    assert not failures, failures
