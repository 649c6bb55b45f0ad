"""The processes the supervisor starts that compute run nicer than it, every thread of them and
their session's autogroup; the routers and the gateway, which relay every request, run at its own
priority (console/supervisor/priority.py). Real child processes, no vLLM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from console.control.daemon import Supervisor
from console.deployments.models import Deployment
from console.supervisor import process_requests
from console.supervisor.models import ManagedProcess
from console.supervisor.priority import autogroup_nice, has_autogroups
from tests.console.sockets import wait_for
from tests.console.test_requested_processes import tick_until
from tests.console.test_supervisor import python_spec, spawn, supervisor  # noqa: F401 - fixture

# A thread started after the interpreter is up, as vLLM starts its engine's threads.
THREADED = ("import threading, time; time.sleep(0.3); "
            "threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)")


def thread_nices(pid: int) -> list[int]:
    """The nice value of each of ``pid``'s threads (field 19 of /proc/PID/task/TID/stat)."""
    nices = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        nices.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return nices


def two_threads(pid: int) -> list[int]:
    wait_for(lambda: len(thread_nices(pid)) == 2, "the child's second thread")
    return thread_nices(pid)


def expect_group(pid: int, steps: int) -> None:
    """On a kernel with autogroups (this machine's and CI's) a child's session weighs against
    the supervisor's by its autogroup nice, which must be ``steps`` nicer than the supervisor's
    autogroup, or than its threads where it runs in init's session (CI's)."""
    if not has_autogroups():
        assert not Path("/proc/sys/kernel/sched_autogroup_enabled").exists()
        return
    own = autogroup_nice("self")
    base = os.getpriority(os.PRIO_PROCESS, 0) if own is None else own
    assert autogroup_nice(pid) == min(19, base + steps)


def test_a_worker_and_its_threads_run_nicer_and_its_router_does_not(
        supervisor: Supervisor, deployment: Deployment,  # noqa: F811 - the fixture
        settings: Any) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert settings.PDSERVE_ENGINE_NICE == 10  # the default
    worker = spawn(supervisor, deployment, python_spec("decode-0", THREADED))
    router = spawn(supervisor, deployment, python_spec("router-0", THREADED))
    assert router.kind == ManagedProcess.Kind.ROUTER
    assert two_threads(worker.popen.pid) == [min(19, own + 10)] * 2
    assert two_threads(router.popen.pid) == [own] * 2
    expect_group(worker.popen.pid, 10)
    expect_group(router.popen.pid, 0)


def test_a_requested_builder_runs_nicer_and_the_setting_can_turn_it_off(
        supervisor: Supervisor, tmp_path: Path,  # noqa: F811 - the fixture
        settings: Any) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    row = process_requests.request(ManagedProcess.Kind.BUILDER, "build-1",
                                   ["python3", "-c", THREADED], {}, tmp_path / "b.log", None,
                                   role="builder")
    tick_until(supervisor, row, ManagedProcess.State.STARTING, ManagedProcess.State.READY)
    assert row.pid is not None
    assert two_threads(row.pid) == [min(19, own + 10)] * 2
    expect_group(row.pid, 10)
    settings.PDSERVE_ENGINE_NICE = 0
    row = process_requests.request(ManagedProcess.Kind.BUILDER, "build-2",
                                   ["python3", "-c", THREADED], {}, tmp_path / "c.log", None,
                                   role="builder")
    tick_until(supervisor, row, ManagedProcess.State.STARTING, ManagedProcess.State.READY)
    assert row.pid is not None
    assert two_threads(row.pid) == [own] * 2
    expect_group(row.pid, 0)
