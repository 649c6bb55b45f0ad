"""Socket and waiting helpers shared by the console tests that run real processes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

# Ports this test process has handed out: the kernel may give a just-closed port again, and
# two of one plan's ports alike make a port conflict the test did not mean (seen in CI).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    # An ephemeral port from the kernel: clear of the 8000-8400 and 5600-5700 ranges that
    # deployments and the benchmarks use; never one this process handed out before.
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0,
             interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
