"""Shared by every suite: each suite's wall time at the end of a run (tests/suite_times.py), and
the session's borrowable tiny-model deployment (tests/borrowed.py), closed after its last borrower
(tests/early_teardown.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import early_teardown
from tests.borrowed import Handle, borrow, shutdown
from tests.tiny_llama import TEST_CACHE_DIR

# Every console a test starts passes it to its workers (settings.PDSERVE_CACHE_DIR).
os.environ["PDSERVE_CACHE_DIR"] = str(TEST_CACHE_DIR)
# And starts them without torch.compile (settings.PDSERVE_ENFORCE_EAGER), as do the tests that
# start vLLM themselves: compiling was most of make test's time (1-5 minutes a server here),
# and what the tests prove does not depend on it (every comparison is eager on both sides).
os.environ["PDSERVE_ENFORCE_EAGER"] = "1"

pytest_plugins = ["tests.suite_times"]
early_teardown.register("borrowed", shutdown)


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


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(early_teardown.LastUsers(), "pdserve-early-teardown")


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutdown()
