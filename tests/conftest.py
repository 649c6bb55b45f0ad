"""Shared by every suite: each suite's wall time at the end of a run (tests/suite_times.py), and
the session's borrowable tiny-model deployment (tests/borrowed.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.borrowed import Handle, borrow, shutdown

pytest_plugins = ["tests.suite_times"]


@pytest.fixture
def borrowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Handle]:
    """The session's running tiny-model deployment (started on first use), lent for one test and
    put back clean after it; the test fails if it cannot be."""
    with borrow(tmp_path_factory.getbasetemp() / "borrowed") as handle:
        yield handle


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Borrowing starts real vLLM workers (once a session).
    for item in items:
        if "borrowed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutdown()
