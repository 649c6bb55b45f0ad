"""The process engine: the one code that spawns, probes, stops, reaps and recovers every row of
the process table, whatever its kind.

Planned kinds (a deployment's workers and router) are spawned by the control loop from the plan
and restarted with backoff when they exit. They outlive a supervisor that dies: each writes its
output straight to its log file, which the supervisor follows, so the next supervisor adopts the
ones still running instead of restarting them. Requested kinds (gate reference servers, measurement
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

import httpx
from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from console.deployments.models import Deployment
from console.fleet.models import Node
from console.supervisor.capture import CapturedLine, clean_line
from console.supervisor.children import Adopted, Backoff, Child
from console.supervisor.health_probe import probe_health
from console.supervisor.log_follow import LogFollow, follow_log
from console.supervisor.models import ManagedProcess
from console.supervisor.priority import lower_priority
from console.supervisor.worker_keys import process_key
from inference.child_env import child_environment
from inference.health_rule import ProbeRule
from inference.process_groups import is_same_process, kill_group
from inference.worker_auth import WORKER_KEY_ENV

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
class ProcessEngine:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    probe_timeout_s: float = 0.5
    # A starting worker silent this long is hung (settings.PDSERVE_START_STALL_S).
    start_stall_s: float = field(default_factory=lambda: float(settings.PDSERVE_START_STALL_S))
    children: dict[int, Child] = field(default_factory=dict)
    backoff: dict[tuple[int | None, str], Backoff] = field(default_factory=dict)
    probe_rules: dict[int, ProbeRule] = field(default_factory=dict)
    captured: queue.SimpleQueue[CapturedLine] = field(default_factory=queue.SimpleQueue)
    last_owner_check: float = 0.0
    # The node whose processes this engine owns: a node agent's; None for the console's own
    # node (`manage.py supervise`), which also owns the rows of no node (requested processes).
    node_id: int | None = None

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=self.probe_timeout_s)

    def owned(self) -> QuerySet[ManagedProcess]:
        """The process table's rows of this engine's node."""
        if self.node_id is not None:
            return ManagedProcess.objects.filter(node_id=self.node_id)
        local = Node.objects.local()
        return ManagedProcess.objects.filter(
            Q(node=None) | Q(node=local) if local is not None else Q(node=None))

    # ---- start-up ----------------------------------------------------------------------
    def recover(self) -> int:
        """Settle the rows a previous supervisor left alive: adopt the planned processes still
        running for a deployment that should run; mark the others failed, killing what still
        runs of them. Returns how many rows were settled."""
        fixed = 0
        for record in self.owned().filter(
                state__in=ManagedProcess.ALIVE_STATES).select_related("deployment"):
            alive = is_same_process(record.pid, record.started_at)
            if alive and adoptable(record):
                self.adopt(record)
                fixed += 1
                continue
            if alive:
                # Running but nobody will supervise it: it would hold its ports forever.
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
            ended, code = child.ended()
            if not ended:
                if child.stop_deadline is not None and time.monotonic() > child.stop_deadline:
                    kill_group(child.popen.pid, signal.SIGKILL)
                continue
            did = True
            # The leader is gone; make sure no engine subprocess of its group outlives it.
            kill_group(child.popen.pid, signal.SIGKILL)
            child.follow.finish()
            child.capture.join(timeout=5)
            del self.children[record_id]
            self.probe_rules.pop(record_id, None)
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
            error = f"{child.failure or exited(code)}; restarting in {delay:.0f} s. " \
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
            state, error = State.FAILED, f"{exited(code)}. Last log line: {last_line(record)}"
        if error:
            log.warning("%s: %s", record, error)
        ManagedProcess.objects.filter(pk=record.pk).update(
            state=state, exit_code=code, pid=None, last_error=error[:500],
            wanted=ManagedProcess.Wanted.STOPPED, updated=timezone.now())

    def start_requested(self) -> bool:
        """Spawn requested rows that want to run and have not been started; stop the ones whose
        requester now wants them stopped."""
        did = False
        requested = self.owned().exclude(kind__in=ManagedProcess.PLANNED_KINDS)
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
            # A ready child's slow probe is judged against its recent latencies (health_probe.py).
            rule = self.probe_rules.setdefault(child.record_id, ProbeRule())
            healthy, degraded = (True, "") if record.port is None else probe_health(
                self.http, record.url, rule, ready=record.state == State.READY)
            child.next_probe = now + (1.0 if record.state == State.STARTING else 2.0)
            if degraded != record.degraded:
                ManagedProcess.objects.filter(pk=record.pk).update(
                    degraded=degraded, updated=timezone.now())
                did = True
            if not healthy and record.state == State.STARTING and self._stalled(child, record, now):
                did = True
            elif healthy and record.state == State.STARTING:
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

    def _stalled(self, child: Child, record: ManagedProcess, now: float) -> bool:
        """Kill a planned process that has written nothing for ``start_stall_s`` while
        starting: the crash path restarts it. A vLLM worker whose engine's worker process hung
        at spawn was seen here to wait silently until stopped, 8 minutes later; every phase of
        a healthy start logs within about a minute, even on two loaded cores."""
        if child.kind not in ManagedProcess.PLANNED_KINDS:
            return False
        try:
            size = os.stat(record.log_path).st_size
        except OSError:
            size = 0  # no log yet: silent as well
        if size != child.output_size:
            child.output_size, child.output_at = size, now
            return False
        if now - child.output_at < self.start_stall_s:
            return False
        child.failure = f"wrote nothing for {self.start_stall_s:.0f} s while starting; killed"
        log.warning("%s: %s", child.slot, child.failure)
        kill_group(child.popen.pid, signal.SIGKILL)
        child.output_size = -1
        return True

    # ---- spawning and stopping ---------------------------------------------------------
    def spawn(self, record: ManagedProcess, argv: list[str], env: dict[str, str],
              restarts: int | None = None) -> Child | None:
        """Start ``argv`` for ``record``: its own process group, output straight to its log file,
        which a thread follows into the capture queue. The row becomes ``starting`` with the pid
        and start time."""
        log_path = Path(record.log_path)
        header = f"=== pdserve {timezone.now().isoformat(timespec='seconds')} starting " \
                 f"{record.slot}: {' '.join(argv)}\n".encode()
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(log_path, "ab")  # noqa: SIM115 - the capture thread closes it
            log_file.write(header)
            log_file.flush()
            offset = log_file.tell()
        except OSError as exc:
            self._unstartable(record, f"cannot write its log {log_path}: {exc.strerror or exc}")
            return None
        launch = argv if record.kind in ManagedProcess.PLANNED_KINDS else [*DIE_WITH_SUPERVISOR, *argv]
        try:
            popen = subprocess.Popen(  # noqa: S603 - argv built from a validated plan or request
                launch,
                # The file, not a pipe to this process: a worker must not lose its output, or
                # die of a broken pipe, when the supervisor dies; the next one follows the file.
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment(record, env),
                cwd=str(settings.BASE_DIR),
                # Own process group: the group is what gets stopped, engine subprocesses
                # included, and a Ctrl-C in the operator's terminal reaches only the supervisor.
                start_new_session=True,
            )
        except OSError as exc:
            self._unstartable(record, f"cannot start {launch[0] if launch else 'an empty command'}: "
                                      f"{exc.strerror or exc}")
            return None
        finally:
            log_file.close()  # the child has its own copy
        lower_priority(popen.pid, record.kind)
        fields: dict[str, object] = {"restarts": restarts} if restarts is not None else {}
        ManagedProcess.objects.filter(pk=record.pk).update(
            pid=popen.pid, state=State.STARTING, command=argv, exit_code=None, degraded="",
            started_at=timezone.now(), ready_at=None, updated=timezone.now(), **fields)
        self.captured.put(CapturedLine(record.pk, clean_line(header), timezone.now()))
        child = self._follow(record, popen, log_path, offset)
        log.info("started %s/%s pid %d", record.owner_name, record.slot, popen.pid)
        return child

    def adopt(self, record: ManagedProcess) -> Child:
        """Take over ``record``'s running process, which a previous supervisor started: its
        row keeps its state, pid and restart count, and its log is followed from its end (the
        lines written while no supervisor ran are in the file)."""
        assert record.pid is not None and record.started_at is not None
        log_path = Path(record.log_path)
        note = f"=== pdserve {timezone.now().isoformat(timespec='seconds')} adopted " \
               f"{record.slot} (pid {record.pid}) after a supervisor restart\n".encode()
        try:
            with open(log_path, "ab") as log_file:
                log_file.write(note)
                log_file.flush()
                offset = log_file.tell()
        except OSError as exc:
            # Followed from its end all the same: never the whole file again.
            log.warning("%s: cannot write to its log %s (%s)", record.slot, log_path,
                        exc.strerror or exc)
            offset = log_path.stat().st_size if log_path.exists() else 0
        self.captured.put(CapturedLine(record.pk, clean_line(note), timezone.now()))
        child = self._follow(record, Adopted(record.pid, record.started_at), log_path, offset)
        ManagedProcess.objects.filter(pk=record.pk).update(updated=timezone.now())
        log.info("adopted %s/%s pid %d", record.owner_name, record.slot, record.pid)
        return child

    def _follow(self, record: ManagedProcess, process: subprocess.Popen[bytes] | Adopted,
                log_path: Path, offset: int) -> Child:
        """Register ``process`` as ``record``'s child, with a thread following its log file."""
        follow = LogFollow(log_path)
        capture = threading.Thread(target=follow_log,
                                   args=(record.pk, follow, offset, self.captured),
                                   name=f"capture-{record.slot}", daemon=True)
        child = Child(record.pk, record.deployment_id, record.slot, process, capture, follow,
                      kind=record.kind)
        self.children[record.pk] = child
        capture.start()
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


def environment(record: ManagedProcess, env: dict[str, str]) -> dict[str, str]:
    """``record``'s whole environment: the supervisor's allowed variables (never its secrets,
    inference/child_env.py), its spec's ``env``, and for a vLLM server its key, added here so
    that it is stored nowhere (a requested row keeps its ``env``)."""
    key = process_key(record)
    return child_environment({**env, WORKER_KEY_ENV: key} if key else env)


def adoptable(record: ManagedProcess) -> bool:
    """A running process the next supervisor takes over: a deployment's worker or router while
    the deployment should run, and the gateway, unless it was being stopped (anything else is
    stopped as an orphan)."""
    if record.state == State.STOPPING or record.pid is None or record.started_at is None:
        return False
    if record.kind == ManagedProcess.Kind.GATEWAY:
        return True  # the next supervisor's reconcile stops it if its settings turned it off
    return (record.kind in ManagedProcess.PLANNED_KINDS and record.deployment is not None
            and record.deployment.desired_state == Deployment.DesiredState.RUNNING)


def exited(code: int | None) -> str:
    if code is None:
        return "exited (its exit code is unknown: a previous supervisor started it)"
    return f"exited with code {code}"


def last_line(record: ManagedProcess) -> str:
    return next((line for line in reversed(record.tail(20)) if line.strip()), "")
