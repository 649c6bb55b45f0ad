"""What the e2e tests that drive a console through its API share: waiting for a state, and
reading a 201."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float,
               interval_s: float = 0.5) -> Any:
    """Poll until ``condition()`` gives something true, and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(interval_s)
    return found


def expect_created(response: httpx.Response) -> dict[str, Any]:
    """The body of a 201; anything else fails with the answer's text."""
    assert response.status_code == 201, response.text
    return dict(response.json())
