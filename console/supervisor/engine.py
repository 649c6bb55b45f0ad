"""The process engine: the one code that spawns, probes, stops, reaps and recovers every row of
the process table, whatever its kind.

Planned kinds (a deployment's workers and router) are spawned by the control loop from the plan
and restarted with backoff when they exit. Requested kinds (gate reference servers, measurement
servers, quantization builders) are spawned from their rows once ``wanted=running``, are never
restarted, and are stopped when their requester sets ``wanted=stopped`` or is gone.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
from django.conf import settings
from django.utils import timezone

from console.supervisor.capture import CapturedLine, clean_line
from console.supervisor.models import ManagedProcess
from inference.process_groups import is_same_process, kill_group

log = logging.getLogger("pdserve.supervisor")

State = ManagedProcess.State
Kind = ManagedProcess.Kind
MAX_BACKOFF_S = 30.0
STOP_GRACE_S = 20.0
# A requested process whose requester is gone has nobody to answer: it gets a short grace.
ORPHAN_GRACE_S = 5.0
OWNER_CHECK_EVERY_S = 1.0
# A requested process dies with the supervisor (SIGTERM from the kernel, even when the supervisor
# was SIGKILLed): its requester waits on the supervisor, and nothing else could stop it. Planned
# workers outlive it; the next supervisor's recover() settles them. setpriv is util-linux's.
DIE_WITH_SUPERVISOR = ["setpriv", "--pdeathsig", "TERM", "--"]


@dataclass
class Child:
    record_id: int
    deployment_id: int | None
    slot: str
    popen: subprocess.Popen[bytes]
    capture: threading.Thread
    kind: str = Kind.WORKER
    stop_deadline: float | None = None
    next_probe: float = 0.0
    # Why it is being stopped when that is a failure (its requester vanished), else "".
    failure: str = ""


@dataclass
class Backoff:
    failures: int = 0
    retry_at: float = 0.0


@dataclass
class ProcessEngine:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    probe_timeout_s: float = 0.5
    children: dict[int, Child] = field(default_factory=dict)
    backoff: dict[tuple[int | None, str], Backoff] = field(default_factory=dict)
    captured: queue.SimpleQueue[CapturedLine] = field(default_factory=queue.SimpleQueue)
    last_owner_check: float = 0.0

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=self.probe_timeout_s)

    # ---- start-up ----------------------------------------------------------------------
    def recover(self) -> int:
        """Mark rows a previous supervisor left alive failed, killing what still runs of them.
        Returns how many were fixed."""
        fixed = 0
        for record in ManagedProcess.objects.filter(state__in=ManagedProcess.ALIVE_STATES):
            if is_same_process(record.pid, record.started_at):
                # Still running but nobody supervises it: it would hold its ports forever.
                kill_group(record.pid, signal.SIGKILL)
                error = "orphaned by a previous supervisor; killed"
            else:
                error = "process gone when the supervisor started"
            ManagedProcess.objects.filter(pk=record.pk).update(
                state=State.FAILED, last_error=error, pid=None, updated=timezone.now(),
                # A requested process is never restarted: its requester sees it failed.
                **({} if record.kind in ManagedProcess.PLANNED_KINDS
                   else {"wanted": ManagedProcess.Wanted.STOPPED}),
            )
            fixed += 1
        return fixed

    # ---- steps -------------------------------------------------------------------------
    def step(self) -> bool:
        """One round over the table: exits, orphans, requests, health. Returns whether it did
        anything."""
        did = self.reap()
        did = self.check_owners() or did
        did = self.start_requested() or did
        return self.check_health() or did

    def reap(self) -> bool:
        did = False
        for record_id, child in list(self.children.items()):
            code = child.popen.poll()
            if code is None:
                if child.stop_deadline is not None and time.monotonic() > child.stop_deadline:
                    kill_group(child.popen.pid, signal.SIGKILL)
                continue
            did = True
            # The leader is gone; make sure no engine subprocess of its group outlives it.
            kill_group(child.popen.pid, signal.SIGKILL)
            child.capture.join(timeout=5)
            del self.children[record_id]
            if child.kind not in ManagedProcess.PLANNED_KINDS:
                self._requested_exited(child, code)
                continue
            if child.stop_deadline is not None:
                ManagedProcess.objects.filter(pk=record_id).update(
                    state=State.STOPPED, exit_code=code, pid=None, updated=timezone.now()
                )
                continue
            key = (child.deployment_id, child.slot)
            record = ManagedProcess.objects.filter(pk=record_id).first()
            if record is None:
                # Deleted (with its deployment, in the admin) while it ran: nothing to record.
                self.backoff.pop(key, None)
                continue
            backoff = self.backoff.setdefault(key, Backoff())
            backoff.failures += 1
            delay = min(MAX_BACKOFF_S, 2.0 ** (backoff.failures - 1))
            backoff.retry_at = time.monotonic() + delay
            error = f"exited with code {code}; restarting in {delay:.0f} s. " \
                    f"Last log line: {last_line(record)}"
            log.warning("%s: %s", record, error)
            ManagedProcess.objects.filter(pk=record_id).update(
                state=State.FAILED, exit_code=code, pid=None, last_error=error[:500],
                updated=timezone.now(),
            )
        return did

    def _requested_exited(self, child: Child, code: int) -> None:
        record = ManagedProcess.objects.filter(pk=child.record_id).first()
        if record is None:
            return
        if child.failure:
            state, error = State.FAILED, child.failure
        elif child.stop_deadline is not None or (code == 0 and record.port is None):
            # Stopped on request, or a job (no port) that finished its work.
            state, error = State.STOPPED, ""
        else:
            state, error = State.FAILED, f"exited with code {code}. Last log line: {last_line(record)}"
        if error:
            log.warning("%s: %s", record, error)
        ManagedProcess.objects.filter(pk=record.pk).update(
            state=state, exit_code=code, pid=None, last_error=error[:500],
            wanted=ManagedProcess.Wanted.STOPPED, updated=timezone.now())

    def start_requested(self) -> bool:
        """Spawn requested rows that want to run and have not been started; stop the ones whose
        requester now wants them stopped."""
        did = False
        requested = ManagedProcess.objects.exclude(kind__in=ManagedProcess.PLANNED_KINDS)
        for record in requested.filter(wanted=ManagedProcess.Wanted.RUNNING, state=State.STOPPED,
                                       pid=None, started_at=None):
            if record.pk in self.children:
                continue
            did = True
            if record.owner_pid is not None and not is_same_process(record.owner_pid,
                                                                     record.owner_started_at):
                self._unstartable(record, f"its requester (pid {record.owner_pid}) was gone "
                                          "before it started")
                continue
            # Taken only while still wanted: a release that came first leaves it unstarted, and
            # one that comes after sees it started and waits for its stop.
            if ManagedProcess.objects.filter(pk=record.pk, wanted=ManagedProcess.Wanted.RUNNING,
                                             started_at=None).update(
                    started_at=timezone.now(), state=State.STARTING, updated=timezone.now()):
                self.spawn(record, record.command, record.env)
        released = set(requested.filter(wanted=ManagedProcess.Wanted.STOPPED,
                                        pk__in=list(self.children)).values_list("pk", flat=True))
        for record_id in released:
            child = self.children[record_id]
            if child.stop_deadline is None:
                self.stop(child)
                did = True
        return did

    def check_owners(self) -> bool:
        """Stop requested processes whose requester died (a Celery worker killed mid-task)."""
        now = time.monotonic()
        if now - self.last_owner_check < OWNER_CHECK_EVERY_S:
            return False
        self.last_owner_check = now
        did = False
        watched = [c for c in self.children.values()
                   if c.kind not in ManagedProcess.PLANNED_KINDS and c.stop_deadline is None]
        owners = {pk: (pid, started) for pk, pid, started in ManagedProcess.objects.filter(
            pk__in=[c.record_id for c in watched]).values_list("pk", "owner_pid", "owner_started_at")}
        for child in watched:
            owner, started = owners.get(child.record_id, (None, None))
            if owner is None or is_same_process(owner, started):
                continue
            child.failure = f"its requester (pid {owner}) is gone; stopped"
            log.warning("%s: %s", child.slot, child.failure)
            self.stop(child, ORPHAN_GRACE_S)
            did = True
        return did

    def check_health(self) -> bool:
        did = False
        now = time.monotonic()
        for child in self.children.values():
            if child.stop_deadline is not None or now < child.next_probe:
                continue
            record = ManagedProcess.objects.filter(pk=child.record_id).first()
            if record is None:
                continue  # its row was deleted in the admin; reap() forgets it once it exits
            # A process without a port (a builder) is ready once it runs.
            healthy = record.port is None or self._probe(record.url)
            child.next_probe = now + (1.0 if record.state == State.STARTING else 2.0)
            if healthy and record.state == State.STARTING:
                ManagedProcess.objects.filter(pk=record.pk).update(
                    state=State.READY, ready_at=timezone.now(), last_error="",
                    updated=timezone.now(),
                )
                self.backoff.pop((child.deployment_id, child.slot), None)
                did = True
            elif not healthy and record.state == State.READY:
                ManagedProcess.objects.filter(pk=record.pk).update(
                    state=State.STARTING, last_error="health check failing",
                    updated=timezone.now(),
                )
                did = True
        return did

    # ---- spawning and stopping ---------------------------------------------------------
    def spawn(self, record: ManagedProcess, argv: list[str], env: dict[str, str],
              restarts: int | None = None) -> Child | None:
        """Start ``argv`` for ``record``: its own process group, output to its log file and to
        the capture queue. The row becomes ``starting`` with the pid and start time."""
        log_path = Path(record.log_path)
        header = f"=== pdserve {timezone.now().isoformat(timespec='seconds')} starting " \
                 f"{record.slot}: {' '.join(argv)}\n".encode()
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(log_path, "ab")  # noqa: SIM115 - the capture thread closes it
            log_file.write(header)
            log_file.flush()
        except OSError as exc:
            self._unstartable(record, f"cannot write its log {log_path}: {exc.strerror or exc}")
            return None
        launch = argv if record.kind in ManagedProcess.PLANNED_KINDS else [*DIE_WITH_SUPERVISOR, *argv]
        try:
            popen = subprocess.Popen(  # noqa: S603 - argv built from a validated plan or request
                launch,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=str(settings.BASE_DIR),
                # Own process group: the group is what gets stopped, engine subprocesses
                # included, and a Ctrl-C in the operator's terminal reaches only the supervisor.
                start_new_session=True,
            )
        except OSError as exc:
            log_file.close()
            self._unstartable(record, f"cannot start {launch[0] if launch else 'an empty command'}: "
                                      f"{exc.strerror or exc}")
            return None
        fields: dict[str, object] = {"restarts": restarts} if restarts is not None else {}
        ManagedProcess.objects.filter(pk=record.pk).update(
            pid=popen.pid, state=State.STARTING, command=argv, exit_code=None,
            started_at=timezone.now(), ready_at=None, updated=timezone.now(), **fields)
        self.captured.put(CapturedLine(record.pk, clean_line(header), timezone.now()))
        capture = threading.Thread(target=self._capture, args=(record.pk, popen, log_file),
                                   name=f"capture-{record.slot}", daemon=True)
        capture.start()
        child = Child(record.pk, record.deployment_id, record.slot, popen, capture, kind=record.kind)
        self.children[record.pk] = child
        log.info("started %s/%s pid %d", record.owner_name, record.slot, popen.pid)
        return child

    def _unstartable(self, record: ManagedProcess, error: str) -> None:
        """A command that cannot even be executed: failed, and for a planned kind retried with
        backoff like a crash (the plan may be fixed meanwhile)."""
        log.warning("%s: %s", record.slot, error)
        fields: dict[str, object] = {}
        if record.kind in ManagedProcess.PLANNED_KINDS:
            backoff = self.backoff.setdefault((record.deployment_id, record.slot), Backoff())
            backoff.failures += 1
            backoff.retry_at = time.monotonic() + min(MAX_BACKOFF_S, 2.0 ** (backoff.failures - 1))
        else:
            fields["wanted"] = ManagedProcess.Wanted.STOPPED
        # started_at marks it taken, so a requester sees the failure instead of waiting.
        ManagedProcess.objects.filter(pk=record.pk).update(
            state=State.FAILED, pid=None, last_error=error[:500], started_at=timezone.now(),
            updated=timezone.now(), **fields)

    def _capture(self, record_id: int, popen: subprocess.Popen[bytes], log_file: IO[bytes]) -> None:
        """Copy a child's output line by line to its log file and to the store's queue."""
        assert popen.stdout is not None
        try:
            # hot path: runs once per line a worker prints
            for raw in iter(popen.stdout.readline, b""):
                log_file.write(raw)
                log_file.flush()
                self.captured.put(CapturedLine(record_id, clean_line(raw), timezone.now()))
        finally:
            popen.stdout.close()
            log_file.close()

    def stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> None:
        child.stop_deadline = time.monotonic() + grace_s
        kill_group(child.popen.pid, signal.SIGTERM)
        ManagedProcess.objects.filter(pk=child.record_id).update(
            state=State.STOPPING, updated=timezone.now()
        )
        self.backoff.pop((child.deployment_id, child.slot), None)

    def stop_children(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every child and wait for them (the supervisor is shutting down)."""
        for child in self.children.values():
            if child.stop_deadline is None:
                self.stop(child, grace_s)
        deadline = time.monotonic() + grace_s + 5
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)

    def _probe(self, url: str) -> bool:
        try:
            return self.http.get(f"{url}/health").status_code == 200
        except httpx.HTTPError:
            # Not answering is what the probe measures: the state machine records it.
            return False


def last_line(record: ManagedProcess) -> str:
    return next((line for line in reversed(record.tail(20)) if line.strip()), "")
