"""The supervisor: spawns the processes of running deployments and keeps the table true.

Each tick runs a few small steps, each returning whether it did anything:
``reap`` (notice exits), ``reconcile`` (start what should run, stop what should not),
``check_health`` (starting -> ready) and ``sweep`` (old shared-storage KV files).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil
from django.conf import settings
from django.utils import timezone

from console.deployments.models import Deployment
from console.deployments.processes import ProcessSpec, kv_channel, process_specs
from console.supervisor.models import ManagedProcess
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
    log_file: IO[bytes]
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

    def __post_init__(self) -> None:
        self.http = httpx.Client(timeout=self.probe_timeout_s)

    # ---- start-up ----------------------------------------------------------------------
    def recover(self) -> int:
        """Mark records a previous supervisor left as alive. Returns how many were fixed."""
        fixed = 0
        for record in ManagedProcess.objects.filter(state__in=ManagedProcess.ALIVE_STATES):
            if record.pid and _alive(record.pid):
                # Still running but nobody supervises it: it would hold its ports forever.
                _kill_group(record.pid, signal.SIGKILL)
                error = "orphaned by a previous supervisor; killed"
            else:
                error = "process gone when the supervisor started"
            ManagedProcess.objects.filter(pk=record.pk).update(
                state=State.FAILED, last_error=error, pid=None, updated=timezone.now()
            )
            fixed += 1
        return fixed

    # ---- the loop ----------------------------------------------------------------------
    def tick(self) -> bool:
        did = self.reap()
        did = self.reconcile() or did
        did = self.check_health() or did
        return self.sweep() or did

    def reap(self) -> bool:
        did = False
        for record_id, child in list(self.children.items()):
            code = child.popen.poll()
            if code is None:
                if child.stop_deadline is not None and time.monotonic() > child.stop_deadline:
                    _kill_group(child.popen.pid, signal.SIGKILL)
                continue
            did = True
            # The leader is gone; make sure no engine subprocess of its group outlives it.
            _kill_group(child.popen.pid, signal.SIGKILL)
            child.log_file.close()
            del self.children[record_id]
            if child.stop_deadline is not None:
                ManagedProcess.objects.filter(pk=record_id).update(
                    state=State.STOPPED, exit_code=code, pid=None, updated=timezone.now()
                )
                continue
            key = (child.deployment_id, child.slot)
            backoff = self.backoff.setdefault(key, Backoff())
            backoff.failures += 1
            delay = min(MAX_BACKOFF_S, 2.0 ** (backoff.failures - 1))
            backoff.retry_at = time.monotonic() + delay
            record = ManagedProcess.objects.get(pk=record_id)
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
        for deployment in Deployment.objects.filter(desired_state=Deployment.DesiredState.RUNNING):
            specs = process_specs(deployment)
            fresh_start = not any(c.deployment_id == deployment.pk for c in self.children.values())
            if fresh_start:
                kv_channel(deployment).prepare()
            for spec in specs:
                running_slots.add((deployment.pk, spec.slot))
                if self._child_for(deployment.pk, spec.slot) is not None:
                    continue
                backoff = self.backoff.get((deployment.pk, spec.slot))
                if backoff is not None and time.monotonic() < backoff.retry_at:
                    continue
                self._spawn(deployment, spec)
                did = True
        for child in list(self.children.values()):
            if (child.deployment_id, child.slot) not in running_slots and child.stop_deadline is None:
                self._stop(child)
                did = True
        return did

    def check_health(self) -> bool:
        did = False
        now = time.monotonic()
        for child in self.children.values():
            if child.stop_deadline is not None or now < child.next_probe:
                continue
            record = ManagedProcess.objects.get(pk=child.record_id)
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

    # ---- stopping ----------------------------------------------------------------------
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
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

    def _spawn(self, deployment: Deployment, spec: ProcessSpec) -> None:
        log_path = self.log_dir / deployment.name / f"{spec.slot}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - owned by the Child until it exits
        stamp = timezone.now().isoformat(timespec="seconds")
        log_file.write(f"=== pdserve {stamp} starting {spec.slot}: {' '.join(spec.argv)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(  # noqa: S603 - argv built from the validated plan
            spec.argv,
            stdout=log_file,
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
            restarts=record.restarts + (0 if created or record.state == State.STOPPED else 1),
            started_at=timezone.now(), ready_at=None, updated=timezone.now(),
        )
        self.children[record.pk] = Child(record.pk, deployment.pk, spec.slot, popen, log_file)
        log.info("started %s/%s pid %d", deployment.name, spec.slot, popen.pid)

    def _stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> None:
        child.stop_deadline = time.monotonic() + grace_s
        _kill_group(child.popen.pid, signal.SIGTERM)
        ManagedProcess.objects.filter(pk=child.record_id).update(
            state=State.STOPPING, updated=timezone.now()
        )
        self.backoff.pop((child.deployment_id, child.slot), None)

    def _probe(self, url: str) -> bool:
        try:
            return self.http.get(f"{url}/health").status_code == 200
        except httpx.HTTPError:
            return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
