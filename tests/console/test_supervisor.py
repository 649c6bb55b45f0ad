"""The supervisor's steps, driven one at a time against real (tiny) processes.

Nothing here starts vLLM: each child is a few lines of Python or `sleep`, so the tests
exercise the real process groups, signals, log files and health probes in a few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from console.control.daemon import Supervisor
from console.control.worker_specs import ProcessSpec
from console.deployments.models import Deployment
from console.supervisor.children import Backoff, Child
from console.supervisor.engine import MAX_BACKOFF_S
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port, listening, wait_for

State = ManagedProcess.State

# The message is computed so the log's command-line header cannot contain it verbatim.
EXIT_3 = "print('loading model'); print('boom: ' + 'model file missing'.upper()); raise SystemExit(3)"

# Answers /health with the status code written in the file named by argv[2], read per request,
# so a test can make a healthy process unhealthy and back.
HEALTH_SERVER = """
import http.server, pathlib, sys
port, status_file = int(sys.argv[1]), pathlib.Path(sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = int(status_file.read_text()) if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# On SIGTERM the leader reports how its own child ended: -15 proves the signal went to the
# whole group, not only to the leader (whose exit would only orphan the child).
WITH_GRANDCHILD = """
import signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
def on_term(signum, frame):
    print(f"grandchild exited {child.wait(timeout=2)}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print(f"grandchild {child.pid}", flush=True)
time.sleep(300)
"""

IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
time.sleep(300)
"""

SLEEPER = "import time; time.sleep(300)"




def is_gone(pid: int) -> bool:
    try:
        # An unreaped zombie has exited; only its parent's bookkeeping is left.
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []



def python_spec(slot: str, script: str, *args: str, env: dict[str, str] | None = None) -> ProcessSpec:
    return ProcessSpec(slot=slot, role=slot.split("-")[0], port=free_port(),
                       argv=[sys.executable, "-c", script, *args], env=env or {})


@pytest.fixture
def supervisor(db: None, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    # Whatever a test left running dies here, grandchildren included; the last resort covers
    # a supervisor too broken to stop its own children.
    leftovers = [proc for child in sup.children.values() for proc in process_tree(child.popen.pid)]
    sup.stop_all(grace_s=1.0)
    for proc in leftovers:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def spawn(supervisor: Supervisor, deployment: Deployment, spec: ProcessSpec) -> Child:
    supervisor._spawn(deployment, spec)
    child = supervisor._child_for(deployment.pk, spec.slot)
    assert child is not None
    return child


def record(deployment: Deployment, slot: str) -> ManagedProcess:
    return ManagedProcess.objects.get(deployment=deployment, slot=slot)


# ---- spawning -------------------------------------------------------------------------------


def test_spawn_records_the_process_and_logs_its_output(supervisor: Supervisor,
                                                       deployment: Deployment) -> None:
    script = "import os; print('mark=' + os.environ['PDSERVE_TEST_MARK'])"
    spec = python_spec("prefill-0", script, env={"PDSERVE_TEST_MARK": "xyzzy"})
    child = spawn(supervisor, deployment, spec)

    row = record(deployment, "prefill-0")
    assert row.state == State.STARTING
    assert row.pid == child.popen.pid
    assert row.port == spec.port
    assert row.command == spec.argv
    assert row.started_at is not None
    assert row.log_path == str(supervisor.log_dir / deployment.name / "prefill-0.log")

    assert child.popen.wait(timeout=10) == 0
    log = Path(row.log_path).read_text()
    assert log.startswith("=== pdserve ")
    # The spec's environment reaches the child (the command-line header does not spell it out).
    assert "mark=xyzzy" in log


def test_restarts_count_within_one_start_of_the_deployment(supervisor: Supervisor,
                                                           deployment: Deployment) -> None:
    first = spawn(supervisor, deployment, python_spec("prefill-0", "pass"))
    first.popen.wait(timeout=10)
    supervisor.reap()
    again = spawn(supervisor, deployment, python_spec("prefill-0", "pass"))
    assert record(deployment, "prefill-0").restarts == 1
    again.popen.wait(timeout=10)
    supervisor.reap()
    # A new start of the deployment (after a stop) starts counting again.
    supervisor._spawn(deployment, python_spec("prefill-0", "pass"), fresh_start=True)
    assert record(deployment, "prefill-0").restarts == 0


# ---- reaping and back-off -------------------------------------------------------------------


def _spawn_and_reap_a_crash(supervisor: Supervisor, deployment: Deployment) -> tuple[float, float]:
    child = spawn(supervisor, deployment, python_spec("prefill-0", EXIT_3))
    child.popen.wait(timeout=10)
    before = time.monotonic()
    assert supervisor.reap() is True
    return before, time.monotonic()


def test_reap_marks_a_crash_failed_with_its_last_log_line(supervisor: Supervisor,
                                                          deployment: Deployment) -> None:
    _spawn_and_reap_a_crash(supervisor, deployment)

    row = record(deployment, "prefill-0")
    assert row.state == State.FAILED
    assert row.exit_code == 3
    assert row.pid is None
    assert "exited with code 3" in row.last_error
    assert row.last_error.endswith("Last log line: boom: MODEL FILE MISSING")
    assert supervisor.children == {}
    # Nothing left to notice.
    assert supervisor.reap() is False


def test_reap_backs_off_exponentially_up_to_a_cap(supervisor: Supervisor,
                                                  deployment: Deployment) -> None:
    key = (deployment.pk, "prefill-0")

    before, after = _spawn_and_reap_a_crash(supervisor, deployment)
    assert supervisor.backoff[key].failures == 1
    assert before + 1.0 <= supervisor.backoff[key].retry_at <= after + 1.0
    assert "restarting in 1 s" in record(deployment, "prefill-0").last_error

    before, after = _spawn_and_reap_a_crash(supervisor, deployment)
    assert supervisor.backoff[key].failures == 2
    assert before + 2.0 <= supervisor.backoff[key].retry_at <= after + 2.0
    row = record(deployment, "prefill-0")
    assert "restarting in 2 s" in row.last_error
    # The respawn of a failed slot counts as a restart.
    assert row.restarts == 1

    # Many failures later the delay stops doubling.
    supervisor.backoff[key] = Backoff(failures=9)
    before, after = _spawn_and_reap_a_crash(supervisor, deployment)
    assert MAX_BACKOFF_S == 30.0
    assert before + 30.0 <= supervisor.backoff[key].retry_at <= after + 30.0
    assert "restarting in 30 s" in record(deployment, "prefill-0").last_error


# ---- health ---------------------------------------------------------------------------------


def test_check_health_moves_starting_to_ready_and_back(supervisor: Supervisor,
                                                       deployment: Deployment,
                                                       tmp_path: Path) -> None:
    status_file = tmp_path / "status"
    status_file.write_text("503")
    spec = python_spec("decode-0", HEALTH_SERVER)
    spec = ProcessSpec(slot=spec.slot, role=spec.role, port=spec.port,
                       argv=[*spec.argv, str(spec.port), str(status_file)])
    child = spawn(supervisor, deployment, spec)
    wait_for(lambda: listening(spec.port) or child.popen.poll() is not None, "the health server")
    assert child.popen.poll() is None, Path(record(deployment, "decode-0").log_path).read_text()
    supervisor.backoff[(deployment.pk, "decode-0")] = Backoff(failures=3)

    # Up but answering 503: still starting.
    assert supervisor.check_health() is False
    assert record(deployment, "decode-0").state == State.STARTING

    # Probes are spaced out: a healthy answer is not seen before the next probe is due.
    status_file.write_text("200")
    assert supervisor.check_health() is False
    assert record(deployment, "decode-0").state == State.STARTING

    child.next_probe = 0.0  # the probe interval has passed
    assert supervisor.check_health() is True
    row = record(deployment, "decode-0")
    assert row.state == State.READY
    assert row.ready_at is not None
    assert row.last_error == ""
    # Becoming ready forgives earlier crashes.
    assert (deployment.pk, "decode-0") not in supervisor.backoff

    status_file.write_text("503")
    child.next_probe = 0.0
    assert supervisor.check_health() is True
    row = record(deployment, "decode-0")
    assert row.state == State.STARTING
    assert row.last_error == "health check failing"


def test_a_starting_worker_that_writes_nothing_is_killed_and_restarted_as_a_crash(
        supervisor: Supervisor, deployment: Deployment) -> None:
    """A hung start (seen: vLLM's worker process never came up, and the server waited silently
    until it was stopped) is killed once it has been silent for the stall limit; one that keeps
    writing is left to start, however long it takes."""
    supervisor.start_stall_s = 1.5
    talker = spawn(supervisor, deployment, python_spec(
        "prefill-0", "import time\nwhile True:\n    print('loading', flush=True)\n"
                     "    time.sleep(0.3)\n"))
    silent = spawn(supervisor, deployment, python_spec(
        "decode-0", "import time\nprint('starting', flush=True)\ntime.sleep(600)\n"))
    deadline = time.monotonic() + 15
    while silent.popen.poll() is None:
        assert time.monotonic() < deadline, "the silent start was never killed"
        talker.next_probe = silent.next_probe = 0.0
        supervisor.check_health()
        time.sleep(0.2)
    started = time.monotonic()
    assert supervisor.reap() is True
    row = record(deployment, "decode-0")
    assert row.state == State.FAILED
    assert row.last_error.startswith("wrote nothing for 2 s while starting; killed; "
                                     "restarting in 1 s"), row.last_error
    assert row.last_error.endswith("Last log line: starting")
    assert supervisor.backoff[(deployment.pk, "decode-0")].retry_at >= started
    # The one that kept writing is still starting.
    assert talker.popen.poll() is None
    assert record(deployment, "prefill-0").state == State.STARTING


# ---- stopping -------------------------------------------------------------------------------


def _log_line(row: ManagedProcess, prefix: str) -> str:
    def found() -> bool:
        return any(line.startswith(prefix) for line in row.tail(50))

    wait_for(found, f"{prefix!r} in {row.log_path}")
    return next(line for line in row.tail(50) if line.startswith(prefix))


def test_stop_all_kills_the_whole_process_group(supervisor: Supervisor,
                                                deployment: Deployment) -> None:
    child = spawn(supervisor, deployment, python_spec("prefill-0", WITH_GRANDCHILD))
    leader = child.popen.pid
    grandchild = int(_log_line(record(deployment, "prefill-0"), "grandchild ").split()[1])
    assert not is_gone(grandchild)

    supervisor.stop_all(grace_s=5.0)

    assert supervisor.children == {}
    assert is_gone(leader)
    assert is_gone(grandchild)
    row = record(deployment, "prefill-0")
    assert f"grandchild exited {-signal.SIGTERM}" in row.tail(5)
    # A stop the supervisor asked for is not a failure and schedules no retry.
    assert row.state == State.STOPPED
    assert row.exit_code == 0
    assert row.pid is None
    assert supervisor.backoff == {}


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(supervisor: Supervisor,
                                                                deployment: Deployment) -> None:
    child = spawn(supervisor, deployment, python_spec("router", IGNORES_SIGTERM))
    _log_line(record(deployment, "router"), "ignoring SIGTERM")

    started = time.monotonic()
    supervisor.stop_all(grace_s=0.3)

    assert time.monotonic() - started < 5.0
    assert child.popen.returncode == -signal.SIGKILL
    assert record(deployment, "router").state == State.STOPPED


def test_reconcile_stops_children_of_a_stopped_deployment(supervisor: Supervisor,
                                                          deployment: Deployment) -> None:
    assert deployment.desired_state == Deployment.DesiredState.STOPPED
    child = spawn(supervisor, deployment, python_spec("prefill-0", SLEEPER))

    assert supervisor.reconcile() is True
    assert child.stop_deadline is not None
    assert record(deployment, "prefill-0").state == State.STOPPING
    # Already stopping: nothing more to do, and no second signal.
    assert supervisor.reconcile() is False

    def reaped() -> bool:
        supervisor.reap()
        return not supervisor.children

    wait_for(reaped, "the child to be reaped")
    row = record(deployment, "prefill-0")
    assert row.state == State.STOPPED
    assert row.exit_code == -signal.SIGTERM
    assert is_gone(child.popen.pid)


# ---- recovery after a supervisor restart ----------------------------------------------------


def _row(deployment: Deployment, slot: str, state: str, pid: int | None,
         started_at: datetime | None = None) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot=slot, role=slot.split("-")[0],
                                         port=free_port(), state=state, pid=pid,
                                         log_path="/nonexistent.log", started_at=started_at)


def test_recover_fails_vanished_records_and_kills_orphans(supervisor: Supervisor,
                                                          deployment: Deployment) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        _row(deployment, "prefill-0", State.STARTING, finished.pid)
        _row(deployment, "decode-0", State.READY, None)
        _row(deployment, "router", State.READY, orphan.pid, started_at=timezone.now())
        _row(deployment, "colocated-0", State.STOPPED, None)
        _row(deployment, "colocated-1", State.FAILED, None)

        assert supervisor.recover() == 3

        # A plain `sleep` dies of the SIGKILL only; a survivor would hold its ports.
        assert orphan.wait(timeout=5) == -signal.SIGKILL
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
            orphan.wait()

    states = dict(ManagedProcess.objects.filter(deployment=deployment).values_list("slot", "state"))
    assert states == {"prefill-0": State.FAILED, "decode-0": State.FAILED, "router": State.FAILED,
                      "colocated-0": State.STOPPED, "colocated-1": State.FAILED}
    router = record(deployment, "router")
    assert "orphaned" in router.last_error
    assert router.pid is None
    assert "gone" in record(deployment, "prefill-0").last_error
    # Nothing was left to fix.
    assert supervisor.recover() == 0


# Prints a numbered line every 50 ms until stopped: what a worker writes while no supervisor runs.
TICKER = """
import itertools, time
for n in itertools.count():
    print(f"tick {n}", flush=True)
    time.sleep(0.05)
"""


def test_a_running_deployments_processes_outlive_their_supervisor_and_are_adopted(
        db: None, tmp_path: Path, deployment: Deployment) -> None:
    """A supervisor that dies leaves its workers writing to their log files (no pipe to break);
    the next one adopts them: same pid, same row, state and restart count kept, new lines
    captured; once the adopted process dies, it is restarted like any crash."""
    Deployment.objects.filter(pk=deployment.pk).update(
        desired_state=Deployment.DesiredState.RUNNING)
    first = Supervisor(log_dir=tmp_path / "logs")
    child = spawn(first, deployment, python_spec("decode-0", TICKER))
    pid = child.popen.pid
    ManagedProcess.objects.filter(pk=child.record_id).update(state=State.READY, restarts=2)
    # One that was being stopped when the supervisor died is not taken over but killed.
    stopping = spawn(first, deployment, python_spec("prefill-0", SLEEPER))
    ManagedProcess.objects.filter(pk=stopping.record_id).update(state=State.STOPPING)
    # The first supervisor is gone without stopping anything (as after SIGKILL): nobody reads
    # the worker's output any more.
    stopping_pid = stopping.popen.pid
    del first, child, stopping
    log_path = Path(record(deployment, "decode-0").log_path)
    size = log_path.stat().st_size
    wait_for(lambda: log_path.stat().st_size > size + 200, "the worker writing on alone")

    second = Supervisor(log_dir=tmp_path / "logs")
    try:
        second.prepared.clear()
        assert second.recover() == 2
        wait_for(lambda: is_gone(stopping_pid), "the process that was being stopped killed")
        assert record(deployment, "prefill-0").state == State.FAILED
        assert second._child_for(deployment.pk, "prefill-0") is None
        adopted = second._child_for(deployment.pk, "decode-0")
        assert adopted is not None and adopted.popen.pid == pid
        row = record(deployment, "decode-0")
        assert (row.state, row.pid, row.restarts) == (State.READY, pid, 2)
        assert deployment.pk in second.prepared  # not a fresh start: KV storage kept
        # Lines written after the adoption reach the capture queue, whole and in order.
        captured: list[str] = []

        def ticks() -> bool:
            while not second.captured.empty():
                captured.append(second.captured.get_nowait().text)
            return sum(line.startswith("tick ") for line in captured) >= 5
        wait_for(ticks, "the adopted worker's lines captured")
        assert "adopted decode-0" in captured[0]
        numbers = [int(line.split()[1]) for line in captured if line.startswith("tick ")]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))

        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: is_gone(pid), "the adopted worker gone")
        wait_for(second.reap, "the adopted worker's exit noticed")
        row = record(deployment, "decode-0")
        assert row.state == State.FAILED and row.pid is None
        assert "exit code is unknown" in row.last_error
    finally:
        leftovers = [proc for c in second.children.values() for proc in process_tree(c.popen.pid)]
        second.stop_all(grace_s=1.0)
        for proc in [*leftovers, *process_tree(pid), *process_tree(stopping_pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


# The leader exits at once; a process of its group writes after it (as vLLM's engine core prints
# its traceback after the API server died), the last line without a newline.
OUTLIVED_BY_ITS_GROUP = """
import os, subprocess, sys
LATE = (
    "import os, sys, time\\n"
    "while os.getppid() == int(sys.argv[1]):\\n"
    "    time.sleep(0.01)\\n"
    "print('written after the leader', flush=True)\\n"
    "sys.stdout.write('no newline at the end')\\n"
    "sys.stdout.flush()\\n"
    "time.sleep(60)\\n"
)
subprocess.Popen([sys.executable, "-c", LATE, str(os.getpid())])
print("leader done", flush=True)
"""


def test_every_line_the_group_wrote_before_it_was_reaped_is_captured(
        supervisor: Supervisor, deployment: Deployment) -> None:
    child = spawn(supervisor, deployment, python_spec("prefill-0", OUTLIVED_BY_ITS_GROUP))
    log_path = Path(record(deployment, "prefill-0").log_path)
    wait_for(lambda: log_path.read_text().endswith("no newline at the end"), "the last write")
    assert child.popen.poll() is not None
    assert supervisor.reap() is True
    assert not child.capture.is_alive()
    lines = []
    while not supervisor.captured.empty():
        lines.append(supervisor.captured.get_nowait().text)
    assert lines[1:] == ["leader done", "written after the leader", "no newline at the end"]


def test_recover_leaves_a_reused_pid_alone(supervisor: Supervisor, deployment: Deployment) -> None:
    # After a reboot the recorded pid may belong to an unrelated program started later.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        _row(deployment, "router", State.READY, stranger.pid,
             started_at=timezone.now() - timedelta(hours=1))
        assert supervisor.recover() == 1
        assert stranger.poll() is None
        assert "gone" in record(deployment, "router").last_error
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()


# ---- the management command -----------------------------------------------------------------


def test_supervise_status_lists_slots_and_states(db: None, deployment: Deployment) -> None:
    out = io.StringIO()
    call_command("supervise", "--status", stdout=out)
    assert out.getvalue().strip() == "no processes"

    _row(deployment, "prefill-0", State.READY, 4242)
    _row(deployment, "decode-0", State.FAILED, None)
    ManagedProcess.objects.filter(slot="decode-0").update(last_error="exited with code 3", restarts=2)
    out = io.StringIO()
    call_command("supervise", "--status", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    by_slot = {line.split()[1]: line.split() for line in lines}
    assert by_slot["prefill-0"][:4] == ["smollm2-1p1d", "prefill-0", "ready", "pid=4242"]
    assert by_slot["decode-0"][:4] == ["smollm2-1p1d", "decode-0", "failed", "pid=-"]
    assert "restarts=2" in by_slot["decode-0"]
    assert lines[[line.split()[1] for line in lines].index("decode-0")].endswith("exited with code 3")


# Were the lock not honoured, the daemon loop would run until the timeout stops it.
@pytest.mark.timeout(20)
def test_only_one_supervisor_per_data_directory(db: None, settings: Any, tmp_path: Path) -> None:
    settings.DATA_DIR = tmp_path
    with open(tmp_path / "supervisor.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(CommandError, match="another supervisor holds"):
            call_command("supervise", stdout=io.StringIO())


# ---- deployments deleted under a running supervisor -----------------------------------------


def test_reap_survives_a_crash_of_a_deleted_deployment(supervisor: Supervisor,
                                                       deployment: Deployment) -> None:
    # An operator gives up on a crash-looping deployment and deletes it in the admin; its
    # process rows go with it while the supervisor still holds the child.
    child = spawn(supervisor, deployment, python_spec("prefill-0", EXIT_3))
    child.popen.wait(timeout=10)
    deployment.delete()

    assert supervisor.reap() is True
    assert supervisor.children == {}
    assert supervisor.backoff == {}


def test_a_deleted_deployment_is_stopped_without_errors(supervisor: Supervisor,
                                                        deployment: Deployment) -> None:
    child = spawn(supervisor, deployment, python_spec("prefill-0", SLEEPER))
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.DesiredState.RUNNING)
    deployment.delete()

    assert supervisor.reconcile() is True
    assert child.stop_deadline is not None
    supervisor.check_health()  # a stopping child is not probed, so its missing row is not read

    def reaped() -> bool:
        supervisor.reap()
        return not supervisor.children

    wait_for(reaped, "the child to be reaped")
    assert child.popen.returncode == -signal.SIGTERM


def test_check_health_survives_a_deleted_process_row(supervisor: Supervisor,
                                                     deployment: Deployment) -> None:
    # The admin lets an operator delete a process row while its process runs.
    spawn(supervisor, deployment, python_spec("decode-0", SLEEPER))
    ManagedProcess.objects.filter(deployment=deployment, slot="decode-0").delete()

    assert supervisor.check_health() is False
    assert len(supervisor.children) == 1
