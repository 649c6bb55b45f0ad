"""`manage.py up` starts a child that died again (the web process, the supervisor, the job
worker) instead of stopping the others, with a growing delay while it keeps dying quickly.
Real child processes; the fault matrix (tests/e2e/test_fault_matrix.py) kills up's real ones."""

from __future__ import annotations

import io
import signal
import time

from django.core.management.base import OutputWrapper

from console.control.management.commands import up
from console.control.management.commands.up import Child, Command


def command() -> tuple[Command, io.StringIO]:
    made, said = Command(), io.StringIO()
    made.stdout = made.stderr = OutputWrapper(said)
    return made, said


def test_a_killed_child_is_started_again_after_the_delay() -> None:
    made, said = command()
    child = Child.spawn("web process", ["sleep", "60"])
    first = child.popen.pid
    made._restart_if_dead(child)
    assert child.popen.pid == first  # alive: left alone
    child.popen.send_signal(signal.SIGKILL)
    child.popen.wait()
    made._restart_if_dead(child)
    assert child.restart_at is not None and child.popen.pid == first
    assert "the web process exited with code -9" in said.getvalue()
    time.sleep(up.RESTART_DELAY_S)
    made._restart_if_dead(child)
    try:
        assert child.popen.pid != first and child.alive()
        assert f"the web process started again (pid {child.popen.pid})" in said.getvalue()
    finally:
        child.popen.kill()
        child.popen.wait()


def test_a_child_that_keeps_dying_waits_longer_each_time() -> None:
    made, _ = command()
    child = Child.spawn("job worker", ["true"])
    delays = []
    for _ in range(3):
        child.popen.wait()
        made._restart_if_dead(child)
        assert child.restart_at is not None
        delays.append(round(child.restart_at - time.monotonic()))
        child.restart_at = time.monotonic()  # not waited out here: only the delay is checked
        made._restart_if_dead(child)
    child.popen.wait()
    assert delays == [1, 2, 4]
