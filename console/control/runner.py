"""The supervisor: spawns the processes of running deployments and keeps the table true.

Each tick runs a few small steps, each returning whether it did anything:
``reap`` (notice exits), ``reconcile`` (start what should run, stop what should not),
``check_health`` (starting -> ready), ``gates`` (output gates once the workers are ready),
``pools`` (a running router's pools follow plan changes, see pools.py) and ``sweep`` (old
shared-storage KV files). A worker that leaves a running plan is stopped once its router has
drained it. Start order: workers, then the gate, then the router;
the router is left out while ``router_hold`` names a reason.
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
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.control.pools import PoolSync
from console.control.worker_specs import ProcessSpec, kv_channel, process_specs
from console.deployments.models import Deployment
from console.live.broadcast import log_messages, send_all
from console.live.collector import MetricsCollector, ScrapeTarget
from console.live.logstore import CapturedLine, LogStore, clean_line
from console.quality.gates import GateRunner
from console.quality.services import router_hold
from console.supervisor.models import ManagedProcess
from console.supervisor.processes import is_same_process, kill_group
from inference.kv_channels import SharedStorageChannel

log = logging.getLogger("pdserve.supervisor")

State = ManagedProcess.State
MAX_BACKOFF_S = 30.0
STOP_GRACE_S = 20.0
SWEEP_EVERY_S = 30.0


@dataclass
class Child:
    record_id: int
    deployment_id: int
    slot: str
    popen: subprocess.Popen[bytes]
    capture: threading.Thread
    stop_deadline: float | None = None
    next_probe: float = 0.0


@dataclass
class Backoff:
    failures: int = 0
    retry_at: float = 0.0


@dataclass
class Supervisor:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    probe_timeout_s: float = 0.5
    children: dict[int, Child] = field(default_factory=dict)
    backoff: dict[tuple[int, str], Backoff] = field(default_factory=dict)
    last_sweep: float = 0.0
    prepared: set[int] = field(default_factory=set)
    captured: queue.SimpleQueue[CapturedLine] = field(default_factory=queue.SimpleQueue)
    log_store: LogStore = field(
        default_factory=lambda: LogStore(retention_lines=settings.PDSERVE_LOG_RETENTION_LINES)
    )
    gates: GateRunner = field(default_factory=GateRunner)
    pools: PoolSync = field(default_factory=PoolSync)

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=self.probe_timeout_s)
        self._writer_stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._collector: MetricsCollector | None = None

    # ---- start-up ----------------------------------------------------------------------
    def recover(self) -> int:
        """Mark records a previous supervisor left as alive. Returns how many were fixed."""
        fixed = 0
        for record in ManagedProcess.objects.filter(state__in=ManagedProcess.ALIVE_STATES):
            if is_same_process(record.pid, record.started_at):
                # Still running but nobody supervises it: it would hold its ports forever.
                kill_group(record.pid, signal.SIGKILL)
                error = "orphaned by a previous supervisor; killed"
            else:
                error = "process gone when the supervisor started"
            ManagedProcess.objects.filter(pk=record.pk).update(
                state=State.FAILED, last_error=error, pid=None, updated=timezone.now()
            )
            fixed += 1
        return fixed + self.gates.recover()

    # ---- the loop ----------------------------------------------------------------------
    def tick(self) -> bool:
        did = self.reap()
        did = self.reconcile() or did
        did = self.check_health() or did
        did = self.gates.step() or did
        did = self.pools.step() or did
        return self.sweep() or did

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
            last_line = next((line for line in reversed(record.tail(20)) if line.strip()), "")
            error = f"exited with code {code}; restarting in {delay:.0f} s. Last log line: {last_line}"
            log.warning("%s: %s", record, error)
            ManagedProcess.objects.filter(pk=record_id).update(
                state=State.FAILED, exit_code=code, pid=None, last_error=error[:500],
                updated=timezone.now(),
            )
        return did

    def reconcile(self) -> bool:
        did = False
        running_slots: set[tuple[int, str]] = set()
        running = list(Deployment.objects.filter(desired_state=Deployment.DesiredState.RUNNING))
        # A deployment's KV storage is emptied once per start, not on every restart of a worker.
        self.prepared &= {d.pk for d in running}
        for deployment in running:
            specs = process_specs(deployment)
            if router_hold(deployment):
                specs = [spec for spec in specs if spec.role != "router"]
            fresh_start = deployment.pk not in self.prepared
            if fresh_start:
                kv_channel(deployment).prepare()
                self.prepared.add(deployment.pk)
            for spec in specs:
                running_slots.add((deployment.pk, spec.slot))
                if self._child_for(deployment.pk, spec.slot) is not None:
                    continue
                backoff = self.backoff.get((deployment.pk, spec.slot))
                if backoff is not None and time.monotonic() < backoff.retry_at:
                    continue
                self._spawn(deployment, spec, fresh_start=fresh_start)
                did = True
        for child in list(self.children.values()):
            if (child.deployment_id, child.slot) not in running_slots and child.stop_deadline is None:
                if self._drained(child):
                    self._stop(child)
                    did = True
        return did

    def _drained(self, child: Child) -> bool:
        """A worker that left a running plan is stopped only once its router has drained it."""
        record = ManagedProcess.objects.filter(pk=child.record_id).select_related("deployment").first()
        if record is None:
            return True
        return self.pools.drained(record.deployment, record.role, record.url)

    def check_health(self) -> bool:
        did = False
        now = time.monotonic()
        for child in self.children.values():
            if child.stop_deadline is not None or now < child.next_probe:
                continue
            record = ManagedProcess.objects.filter(pk=child.record_id).first()
            if record is None:
                continue  # its row was deleted in the admin; reap() forgets it once it exits
            healthy = self._probe(record.url)
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

    def sweep(self) -> bool:
        now = time.monotonic()
        if now - self.last_sweep < SWEEP_EVERY_S:
            return False
        self.last_sweep = now
        removed = 0
        for deployment in Deployment.objects.filter(kv_channel=SharedStorageChannel.name):
            channel = kv_channel(deployment)
            if isinstance(channel, SharedStorageChannel):
                removed += channel.sweep()
        return removed > 0

    # ---- logs ---------------------------------------------------------------------------
    def flush_logs(self) -> bool:
        """Store the lines captured since the last flush, then broadcast them."""
        batch: list[CapturedLine] = []
        while len(batch) < 5000:
            try:
                batch.append(self.captured.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return False
        rows = self.log_store.write(batch)
        if settings.REDIS_URL:
            # Shared channel layer: the supervisor broadcasts itself, right after storing.
            # Without Redis the console's hub polls the stored rows (console/live/hub.py).
            async_to_sync(send_all)(log_messages(rows))
        return True

    def start_log_writer(self, interval_s: float = 0.1) -> None:
        """Flush captured lines from a thread of their own, so a slow tick never delays logs."""

        def loop() -> None:
            last_prune = time.monotonic()
            try:
                while not self._writer_stop.is_set():
                    try:
                        if not self.flush_logs():
                            self._writer_stop.wait(interval_s)
                        if time.monotonic() - last_prune > 60:
                            self.log_store.prune()
                            last_prune = time.monotonic()
                    except Exception:  # a locked database must not end log capture
                        log.exception("storing log lines failed; retrying")
                        self._writer_stop.wait(1.0)
                while self.flush_logs():
                    pass
            finally:
                connection.close()

        self._writer = threading.Thread(target=loop, name="log-writer", daemon=True)
        self._writer.start()

    def stop_log_writer(self) -> None:
        if self._writer is not None:
            self._writer_stop.set()
            self._writer.join(timeout=10)
            self._writer = None

    # ---- metrics ------------------------------------------------------------------------
    def metric_targets(self) -> list[ScrapeTarget]:
        """The children that should be answering, for the collector's thread."""
        # A copy: the tick adds and removes children while the collector iterates.
        children = self.children.copy()
        return [ScrapeTarget(child.record_id, child.popen.pid)
                for child in children.values() if child.stop_deadline is None]

    def start_metrics_collector(self, interval_s: float = 1.0) -> None:
        """Scrape every child's /metrics, CPU and memory once a second, in a thread of its own."""
        self._collector = MetricsCollector(self.metric_targets, interval_s=interval_s)
        self._collector.start()

    def stop_metrics_collector(self) -> None:
        if self._collector is not None:
            self._collector.stop()
            self._collector = None

    # ---- stopping ----------------------------------------------------------------------
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        self.gates.stop_all()
        for child in self.children.values():
            if child.stop_deadline is None:
                self._stop(child, grace_s)
        deadline = time.monotonic() + grace_s + 5
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        self.http.close()

    # ---- helpers -----------------------------------------------------------------------
    def _child_for(self, deployment_id: int, slot: str) -> Child | None:
        for child in self.children.values():
            if child.deployment_id == deployment_id and child.slot == slot:
                return child
        return None

    def _spawn(self, deployment: Deployment, spec: ProcessSpec, fresh_start: bool = False) -> None:
        log_path = self.log_dir / deployment.name / f"{spec.slot}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - the capture thread closes it
        header = f"=== pdserve {timezone.now().isoformat(timespec='seconds')} starting " \
                 f"{spec.slot}: {' '.join(spec.argv)}\n".encode()
        log_file.write(header)
        log_file.flush()
        popen = subprocess.Popen(  # noqa: S603 - argv built from the validated plan
            spec.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **spec.env},
            cwd=str(settings.BASE_DIR),
            # Own process group: the group is what gets stopped, engine subprocesses included,
            # and a Ctrl-C in the operator's terminal reaches only the supervisor.
            start_new_session=True,
        )
        record, created = ManagedProcess.objects.get_or_create(
            deployment=deployment, slot=spec.slot,
            defaults={"role": spec.role, "port": spec.port, "log_path": str(log_path)},
        )
        ManagedProcess.objects.filter(pk=record.pk).update(
            role=spec.role, port=spec.port, pid=popen.pid, state=State.STARTING,
            command=spec.argv, log_path=str(log_path), exit_code=None,
            # Restarts count within one start of the deployment; a new start begins at 0.
            restarts=0 if created or fresh_start else record.restarts + 1,
            started_at=timezone.now(), ready_at=None, updated=timezone.now(),
        )
        self.captured.put(CapturedLine(record.pk, clean_line(header), timezone.now()))
        capture = threading.Thread(target=self._capture, args=(record.pk, popen, log_file),
                                   name=f"capture-{spec.slot}", daemon=True)
        capture.start()
        self.children[record.pk] = Child(record.pk, deployment.pk, spec.slot, popen, capture)
        log.info("started %s/%s pid %d", deployment.name, spec.slot, popen.pid)

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

    def _stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> None:
        child.stop_deadline = time.monotonic() + grace_s
        kill_group(child.popen.pid, signal.SIGTERM)
        ManagedProcess.objects.filter(pk=child.record_id).update(
            state=State.STOPPING, updated=timezone.now()
        )
        self.backoff.pop((child.deployment_id, child.slot), None)

    def _probe(self, url: str) -> bool:
        try:
            return self.http.get(f"{url}/health").status_code == 200
        except httpx.HTTPError:
            return False
