"""Requested kinds of the process table (gate references, measurement servers, builders): the
supervisor's engine spawns them from their rows, probes them, stops them when released or when
their requester is gone, and never restarts them. Real tiny processes, no vLLM."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.core.management import call_command
from django.utils import timezone

from console.catalog.models import BaseModel, Variant
from console.control.daemon import Supervisor
from console.fleet.services import local_node
from console.quality import measure
from console.quality.models import VariantMeasurement
from console.supervisor import process_requests
from console.supervisor.engine import DIE_WITH_SUPERVISOR
from console.supervisor.models import ManagedProcess
from tests.console.sockets import free_port, wait_for
from tests.console.test_supervisor import HEALTH_SERVER, SLEEPER, is_gone
from tests.console.tiny_models import register

State = ManagedProcess.State
Kind = ManagedProcess.Kind


@pytest.fixture
def supervisor(db: None, tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(log_dir=tmp_path / "logs")
    yield sup
    sup.stop_all(grace_s=1.0)


def started_at(pid: int) -> datetime:
    return datetime.fromtimestamp(psutil.Process(pid).create_time(), tz=timezone.get_current_timezone())


def requested_by(requester: subprocess.Popen[str], slot: str, argv: list[str], port: int,
                 tmp_path: Path) -> ManagedProcess:
    """A measurement server's row as ``requester`` (standing in for a Celery worker) asks."""
    return ManagedProcess.objects.create(
        kind=Kind.MEASUREMENT, slot=slot, role="colocated", port=port, command=argv,
        log_path=str(tmp_path / "m.log"), owner_pid=requester.pid,
        owner_started_at=started_at(requester.pid))


def health_server(tmp_path: Path, status: int = 200) -> tuple[list[str], int]:
    port = free_port()
    status_file = tmp_path / f"status-{port}"
    status_file.write_text(str(status))
    return [sys.executable, "-c", HEALTH_SERVER, str(port), str(status_file)], port


def tick_until(supervisor: Supervisor, row: ManagedProcess, *states: str, timeout: float = 15) -> None:
    def there() -> bool:
        supervisor.tick()
        row.refresh_from_db()
        return row.state in states and (row.started_at is not None)
    wait_for(there, f"{row.slot} in {states}", timeout)


def test_a_requested_process_is_spawned_probed_and_stopped_on_release(supervisor: Supervisor,
                                                                      tmp_path: Path) -> None:
    argv, port = health_server(tmp_path)
    row = process_requests.request(Kind.MEASUREMENT, "measure-1-variant", argv, {"PDSERVE_X": "1"},
                           tmp_path / "m.log", port)
    assert (row.state, row.wanted, row.pid, row.owner_pid) == ("stopped", "running", None,
                                                                process_requests.this_process()[0])
    tick_until(supervisor, row, State.READY)
    assert psutil.Process(row.pid).environ()["PDSERVE_X"] == "1"
    assert row.url == f"http://127.0.0.1:{port}"
    assert process_requests.wait_until(row, ready=True, timeout_s=5).state == State.READY

    pid = row.pid
    ManagedProcess.objects.filter(pk=row.pk).update(wanted="stopped")  # what release() writes
    tick_until(supervisor, row, State.STOPPED)
    assert row.pid is None and is_gone(pid)
    # Never restarted: more ticks spawn nothing.
    for _ in range(3):
        supervisor.tick()
    assert supervisor.children == {}


def test_a_requested_process_whose_requester_died_is_stopped_and_failed(supervisor: Supervisor,
                                                                        tmp_path: Path) -> None:
    # A real process stands in for the Celery worker that asked for the server.
    requester = subprocess.Popen([sys.executable, "-c", SLEEPER])
    argv, port = health_server(tmp_path)
    row = requested_by(requester, "measure-2-variant", argv, port, tmp_path)
    tick_until(supervisor, row, State.READY)
    server = row.pid
    requester.kill()
    requester.wait()
    killed = time.monotonic()
    tick_until(supervisor, row, State.FAILED)
    assert time.monotonic() - killed < 10
    assert is_gone(server)
    assert f"its requester (pid {requester.pid}) is gone" in row.last_error
    assert row.wanted == "stopped"


def test_a_requested_process_that_exits_is_failed_with_its_last_line_not_restarted(
        supervisor: Supervisor, tmp_path: Path) -> None:
    script = "print('loading'); print('no such model'); raise SystemExit(4)"
    row = process_requests.request(Kind.GATE_REFERENCE, "gate-9-reference", [sys.executable, "-c", script],
                           {}, tmp_path / "g.log", free_port())
    tick_until(supervisor, row, State.FAILED)
    assert row.exit_code == 4 and "no such model" in row.last_error and row.wanted == "stopped"
    with pytest.raises(process_requests.ProcessFailed, match="no such model"):
        process_requests.wait_until(row, ready=True, timeout_s=1)
    supervisor.tick()
    assert supervisor.children == {}


def test_a_builder_without_a_port_is_ready_at_once_and_done_when_it_exits(
        supervisor: Supervisor, tmp_path: Path) -> None:
    row = process_requests.request(Kind.BUILDER, "build-3",
                                   [sys.executable, "-c", "import time; time.sleep(1)"],
                                   {}, tmp_path / "b.log", None, role="builder")
    tick_until(supervisor, row, State.READY)
    tick_until(supervisor, row, State.STOPPED)
    assert (row.exit_code, row.last_error) == (0, "")
    assert process_requests.wait_until(row, ready=False, timeout_s=1).state == State.STOPPED


def test_a_process_has_ended_only_once_the_supervisor_recorded_its_exit(
        supervisor: Supervisor, tmp_path: Path) -> None:
    row = process_requests.request(Kind.BUILDER, "build-4",
                                   [sys.executable, "-c", "import time; time.sleep(1)"],
                                   {}, tmp_path / "b.log", None, role="builder")
    assert not process_requests.ended(row)
    # The supervisor claims the row (started, no pid yet) before it spawns: a builder job that
    # polled in this window took it for an exit and failed while its builder ran on (seen in
    # make test's quant suite).
    ManagedProcess.objects.filter(pk=row.pk).update(started_at=timezone.now(),
                                                    state=State.STARTING)
    row.refresh_from_db()
    assert row.pid is None and not process_requests.ended(row)
    ManagedProcess.objects.filter(pk=row.pk).update(started_at=None, state=State.STOPPED)
    tick_until(supervisor, row, State.READY)
    assert not process_requests.ended(row)
    tick_until(supervisor, row, State.STOPPED)
    assert process_requests.ended(row)


def test_a_request_nobody_takes_fails_naming_the_supervisor(db: None, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_requests, "PICKUP_TIMEOUT_S", 0.5)
    row = process_requests.request(Kind.MEASUREMENT, "measure-4-variant", ["true"], {}, tmp_path / "x.log",
                           free_port())
    with pytest.raises(process_requests.ProcessFailed, match="manage.py supervise"):
        process_requests.wait_until(row, ready=True, timeout_s=60)
    process_requests.release(row)  # never started: released at once
    row.refresh_from_db()
    assert row.wanted == "stopped"


def test_a_slot_still_running_is_not_requested_twice(supervisor: Supervisor, tmp_path: Path) -> None:
    argv, port = health_server(tmp_path)
    row = process_requests.request(Kind.MEASUREMENT, "measure-5-variant", argv, {}, tmp_path / "m.log", port)
    tick_until(supervisor, row, State.READY)
    with pytest.raises(process_requests.ProcessFailed, match="still running"):
        process_requests.request(Kind.MEASUREMENT, "measure-5-variant", argv, {}, tmp_path / "m.log", port)


def test_a_measurement_whose_celery_worker_died_is_failed_and_can_be_queued_again(
        db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    variant: Variant = register(BaseModel.objects.create(name="tiny"), tmp_path, "bf16")
    node = local_node()
    worker = subprocess.Popen([sys.executable, "-c", SLEEPER])
    sent: list[int] = []
    monkeypatch.setattr(measure.measure_variant, "delay", sent.append)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(worker.kill)
        measurement = VariantMeasurement.objects.create(
            variant=variant, node=node, dtype="float32", state="running", worker_pid=worker.pid,
            worker_started_at=started_at(worker.pid))
        server = ManagedProcess.objects.create(
            kind=Kind.MEASUREMENT, slot=f"measure-{measurement.pk}-variant", role="colocated",
            port=free_port(), state="ready", log_path=str(tmp_path / "m.log"))
        assert measure.reap_orphans() == 0  # its worker is alive: still running
        with pytest.raises(measure.MeasureRefused, match="already being measured"):
            measure.queue_measurement(variant, node)
        worker.kill()
        worker.wait()
        # The supervisor is stopping its server: failed once that is gone, with its reason.
        ManagedProcess.objects.filter(pk=server.pk).update(state="stopping")
        assert measure.reap_orphans() == 0
        ManagedProcess.objects.filter(pk=server.pk).update(
            state="failed", last_error="its requester (pid 1) is gone; stopped")
        assert measure.reap_orphans() == 1
    measurement.refresh_from_db()
    assert measurement.state == "failed"
    assert f"Celery worker (pid {worker.pid}) stopped mid-run" in measurement.error
    assert "requester (pid 1) is gone" in measurement.error
    again = measure.queue_measurement(variant, node)
    assert again.state == "queued" and again.pk != measurement.pk


def test_a_command_that_cannot_be_executed_fails_its_row_and_the_tick_goes_on(
        supervisor: Supervisor, tmp_path: Path) -> None:
    row = process_requests.request(Kind.BUILDER, "build-6", ["/nonexistent/python", "-m", "x"], {},
                           tmp_path / "b.log", None, role="builder")
    tick_until(supervisor, row, State.FAILED)
    assert row.wanted == "stopped"
    assert "/nonexistent/python: No such file or directory" in row.last_error
    with pytest.raises(process_requests.ProcessFailed, match="No such file"):
        process_requests.wait_until(row, ready=False, timeout_s=1)


def test_a_planned_command_that_cannot_be_executed_fails_and_backs_off(
        supervisor: Supervisor, tmp_path: Path) -> None:
    from console.deployments.models import Deployment

    deployment = Deployment.objects.first()
    row = ManagedProcess.objects.create(deployment=deployment, slot="decode-9", role="decode",
                                        port=free_port(), log_path=str(tmp_path / "d.log"))
    assert supervisor.spawn(row, ["/nonexistent/vllm", "serve"], {}) is None
    row.refresh_from_db()
    assert (row.state, row.pid) == ("failed", None)
    assert row.last_error == "cannot start /nonexistent/vllm: No such file or directory"
    assert supervisor.backoff[(deployment.pk if deployment else None, "decode-9")].failures == 1


def test_a_requested_process_dies_with_its_supervisor(db: None, tmp_path: Path) -> None:
    # The supervisor is SIGKILLed: nothing is left to stop the reference or measurement server
    # it ran, so the kernel does (setpriv's parent-death signal).
    script = (
        "import json, subprocess, sys, time\n"
        "child = subprocess.Popen([*json.loads(sys.argv[1]), sys.executable, '-c', "
        "'import time; time.sleep(300)'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script, json.dumps(DIE_WITH_SUPERVISOR)],
                                  stdout=subprocess.PIPE, text=True)
    assert supervisor.stdout is not None
    server = psutil.Process(int(supervisor.stdout.readline()))
    # Once setpriv has executed the server, the parent-death signal is set.
    wait_for(lambda: server.cmdline()[:1] != ["setpriv"], "the server's exec")
    supervisor.kill()
    supervisor.wait()
    wait_for(lambda: is_gone(server.pid), "the server's death with its supervisor", timeout=10)


def test_a_requested_process_has_its_log_page_download_and_status_line(
        supervisor: Supervisor, tmp_path: Path, client: Any, django_user_model: Any) -> None:
    row = process_requests.request(Kind.GATE_REFERENCE, "gate-11-reference",
                           [sys.executable, "-c", "print('reference loading', flush=True)"], {},
                           tmp_path / "g.log", free_port())
    tick_until(supervisor, row, State.FAILED)  # it exited without serving
    # A process of no deployment is a superuser's (tests/console/test_permissions_live.py).
    user = django_user_model.objects.create_superuser("op", password="pw")
    client.force_login(user)
    page = client.get(f"/processes/{row.pk}/log/")
    assert page.status_code == 200 and b"gate-reference / gate-11-reference" in page.content
    download = client.get(f"/api/v1/processes/{row.pk}/logs/download")
    assert download.status_code == 200
    assert download["Content-Disposition"] == 'attachment; filename="gate-reference-gate-11-reference.log"'
    out = io.StringIO()
    call_command("supervise", "--status", stdout=out)
    assert "gate-reference" in out.getvalue() and "gate-11-reference" in out.getvalue()
    # Scraped for no deployment's dashboard.
    assert supervisor.metric_targets() == []


def test_a_pending_request_is_not_taken_over_and_a_release_before_the_start_starts_nothing(
        supervisor: Supervisor, tmp_path: Path) -> None:
    argv, port = health_server(tmp_path)
    row = process_requests.request(Kind.MEASUREMENT, "measure-7-variant", argv, {},
                                   tmp_path / "m.log", port)
    with pytest.raises(process_requests.ProcessFailed, match="still requested"):
        process_requests.request(Kind.MEASUREMENT, "measure-7-variant", argv, {}, tmp_path / "m.log", port)
    process_requests.release(row)  # returns at once: nothing was started
    for _ in range(3):
        supervisor.tick()
    row.refresh_from_db()
    assert (row.state, row.pid, row.started_at, row.wanted) == ("stopped", None, None, "stopped")
    assert supervisor.children == {}
    # Released, the slot can be asked for again.
    again = process_requests.request(Kind.MEASUREMENT, "measure-7-variant", argv, {},
                                     tmp_path / "m.log", port)
    tick_until(supervisor, again, State.READY)


def test_a_request_whose_requester_died_before_the_start_is_failed_unstarted(
        supervisor: Supervisor, tmp_path: Path) -> None:
    requester = subprocess.Popen([sys.executable, "-c", SLEEPER])
    argv, port = health_server(tmp_path)
    row = requested_by(requester, "measure-8-variant", argv, port, tmp_path)
    requester.kill()
    requester.wait()
    supervisor.tick()
    row.refresh_from_db()
    assert (row.state, row.pid, row.wanted) == ("failed", None, "stopped")
    assert f"its requester (pid {requester.pid}) was gone before it started" in row.last_error
    assert supervisor.children == {}
