"""Running one quantization job in the Celery worker: the builder CLI as a child process.

The builder (``python -m inference.quantize``) runs in the quantization environment. Its stdout
carries JSON progress events, its stderr the log; both are copied into the job row every
``HEARTBEAT_S``, which is also the job's heartbeat and when a cancel request is noticed.
"""

from __future__ import annotations

import ctypes
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import psutil
from celery.signals import worker_ready
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.catalog.models import QuantizationJob, Variant
from console.catalog.services import RegistrationError, register_variant
from console.celery import app
from inference.quantization.output import partial_dir
from inference.quantization.progress import parse

State = QuantizationJob.State
LOG_TAIL_LINES = 200
PR_SET_PDEATHSIG = 1
# The task beats every HEARTBEAT_S while its builder runs; a running job silent for STALE_S
# lost its worker.
HEARTBEAT_S = 0.5
STALE_S = 15.0
# At worker start no other worker of this node should be running the job: a shorter wait.
STALE_AT_WORKER_START_S = 3.0


@app.task(name="catalog.quantize_variant", ignore_result=True)
def quantize_variant(job_id: int) -> None:
    run_job(job_id)


def run_job(job_id: int) -> None:
    """Build the variant of job ``job_id`` if it is still queued; record how it ended."""
    now = timezone.now()
    if not QuantizationJob.objects.filter(pk=job_id, state=State.QUEUED).update(
            state=State.RUNNING, started_at=now, heartbeat_at=now, stage="starting"):
        return  # cancelled while queued, or already taken
    job = QuantizationJob.objects.select_related("base", "source").get(pk=job_id)
    if job.source is None:
        _finish(job, State.FAILED, error="the source variant was deleted")
        return
    try:
        child = subprocess.Popen(
            _argv(job), cwd=settings.BASE_DIR, env=_env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
            preexec_fn=_die_with_parent)
    except OSError as exc:
        _finish(job, State.FAILED, error=f"cannot start the builder {settings.PDSERVE_QUANT_PYTHON}: "
                                         f"{exc.strerror or exc} (scripts/install-quant.sh creates it)")
        return
    QuantizationJob.objects.filter(pk=job.pk).update(pid=child.pid)
    job.pid = child.pid
    _Watch(job, child).run()


def _argv(job: QuantizationJob) -> list[str]:
    argv = [settings.PDSERVE_QUANT_PYTHON, "-m", "inference.quantize", "--model", job.source.path,
            "--out", job.path, "--scheme", job.scheme, "--method", job.method,
            "--samples", str(job.samples)]
    if job.group_size:
        argv += ["--group-size", str(job.group_size)]
    if job.smoothing_strength is not None:
        argv += ["--smoothing-strength", f"{job.smoothing_strength:g}"]
    return argv


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _die_with_parent() -> None:
    # In the child before exec: SIGTERM it when the worker dies (even by SIGKILL), so an
    # orphaned builder removes its partial directory and exits instead of running on.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _Watch:
    """Copies the builder's output into the job row until it exits or the job is cancelled."""

    def __init__(self, job: QuantizationJob, child: subprocess.Popen[str]) -> None:
        self.job, self.child = job, child
        self.lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self.log: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.progress: dict[str, Any] = {}
        self.outcome: dict[str, Any] = {}

    def run(self) -> None:
        readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                   for name, stream in (("stdout", self.child.stdout), ("stderr", self.child.stderr))]
        for reader in readers:
            reader.start()
        open_streams = len(readers)
        next_beat = 0.0
        while open_streams:
            try:
                stream, line = self.lines.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                stream, line = "", ""
            if line is None:
                open_streams -= 1
            elif stream:
                self._take(stream, line)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + HEARTBEAT_S
                if self._beat():
                    self._cancel()
                    return
        self.child.wait()
        self._beat()
        self._conclude()

    def _read(self, name: str, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put((name, line))
        self.lines.put((name, None))

    def _take(self, stream: str, line: str) -> None:
        event = parse(line) if stream == "stdout" else None
        if event is None:
            # tqdm redraws with carriage returns: keep the last state of the bar.
            text = line.rstrip("\n").split("\r")[-1].rstrip()
            if text:
                self.log.append(text)
        elif event["event"] == "progress":
            self.progress = event
        else:
            self.outcome = event

    def _beat(self) -> bool:
        """Write progress, log and heartbeat; return whether a cancel was requested."""
        fields: dict[str, Any] = {"heartbeat_at": timezone.now(), "log_tail": "\n".join(self.log)}
        if self.progress:
            fields.update(percent=self.progress.get("percent", 0), stage=self.progress.get("stage", ""),
                          detail=str(self.progress.get("detail", ""))[:200])
        QuantizationJob.objects.filter(pk=self.job.pk, state=State.RUNNING).update(**fields)
        return QuantizationJob.objects.filter(pk=self.job.pk, cancel_requested=True).exists()

    def _cancel(self) -> None:
        kill_builder(self.job)
        self.child.wait()
        remove_outputs(self.job)
        _finish(self.job, State.CANCELLED, log="\n".join(self.log))

    def _conclude(self) -> None:
        log = "\n".join(self.log)
        if self.child.returncode != 0 or self.outcome.get("event") != "done":
            remove_outputs(self.job)
            error = self.outcome.get("error") or (
                f"the builder exited with status {self.child.returncode}: " + "\n".join(list(self.log)[-5:]))
            _finish(self.job, State.FAILED, error=error, log=log)
            return
        try:
            with transaction.atomic():
                variant = register_variant(self.job.base, self.job.name, self.job.path)
                _finish(self.job, State.SUCCEEDED, log=log, variant=variant, percent=100.0,
                        build_seconds=self.outcome.get("seconds"))
        except RegistrationError as exc:
            remove_outputs(self.job)
            _finish(self.job, State.FAILED, error=f"the built directory does not register: {exc}", log=log)


def _finish(job: QuantizationJob, state: str, *, error: str = "", log: str | None = None,
            **fields: Any) -> None:
    values: dict[str, Any] = {"state": state, "finished_at": timezone.now(), "stage": state,
                              "error": error, **fields}
    if log is not None:
        values["log_tail"] = log
    QuantizationJob.objects.filter(pk=job.pk).update(**values)


def reap_orphans(stale_after_s: float = STALE_S) -> int:
    """Fail running jobs whose worker stopped beating, and remove what their builder wrote."""
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    reaped = 0
    for job in QuantizationJob.objects.filter(state=State.RUNNING, heartbeat_at__lt=cutoff):
        kill_builder(job)
        remove_outputs(job)
        reaped += QuantizationJob.objects.filter(pk=job.pk, state=State.RUNNING).update(
            state=State.FAILED, finished_at=timezone.now(), stage="failed",
            error="the job's worker stopped while building (killed or crashed); "
                  "its files were removed")
    return reaped


def kill_builder(job: QuantizationJob, grace_s: float = 10.0) -> None:
    """Stop the job's builder process group, if it is still alive and still the builder."""
    if not job.pid:
        return
    try:
        process = psutil.Process(job.pid)
        # The pid may have been reused since: only a builder of this job's directory is ours.
        if job.path not in process.cmdline():
            return
        os.killpg(job.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except psutil.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        return


def remove_outputs(job: QuantizationJob) -> None:
    """Delete the job's partial directory, and its output unless a variant was registered there."""
    shutil.rmtree(partial_dir(Path(job.path)), ignore_errors=True)
    if not Variant.objects.filter(path=job.path).exists():
        shutil.rmtree(job.path, ignore_errors=True)


@worker_ready.connect
def fail_orphaned_jobs(**_: object) -> None:
    # A worker that was killed mid-build left its job "running": this worker cannot be running
    # it, so any such job whose heartbeat stopped is failed and its files removed.
    reap_orphans(STALE_AT_WORKER_START_S)
