"""Running one quantization job from a Celery task: the builder CLI as a requested process of
the supervisor (console/supervisor/process_requests.py), which alone spawns and stops it.

The builder (``python -m inference.quantize``) runs in the quantization environment. It prints
JSON progress events among its log lines; the task follows its log file and copies both into the
job row every ``HEARTBEAT_S``, which is also the job's heartbeat and when a cancel request is
noticed. A cancel releases the process; the supervisor stops it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from celery.signals import worker_ready
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.actors import acting_as
from console.catalog.models import QuantizationJob, Variant
from console.catalog.services import RegistrationError, register_variant
from console.celery import app
from console.supervisor import process_requests
from console.supervisor.models import ManagedProcess
from inference.quantization.output import partial_dir
from inference.quantization.progress import parse

State = QuantizationJob.State
# How each of the builder's JSON event lines begins (inference/quantization/progress.py).
EVENT_START = '{"event"'
LOG_TAIL_LINES = 200
# The task beats every HEARTBEAT_S while its builder runs; a running job silent for STALE_S
# lost its worker.
HEARTBEAT_S = 0.5
STALE_S = 15.0
# At worker start no other worker of this node should be running the job: a shorter wait.
STALE_AT_WORKER_START_S = 3.0


@app.task(name="quantization.build_variant", ignore_result=True)
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
    python = settings.PDSERVE_QUANT_PYTHON
    if not os.access(python, os.X_OK):
        _finish(job, State.FAILED, error=f"cannot start the builder {python}: no such executable "
                                         "(scripts/install-quant.sh creates it)")
        return
    record = process_requests.request(ManagedProcess.Kind.BUILDER, builder_slot(job), _argv(job), _env(),
                              Path(settings.PDSERVE_LOG_DIR) / "builds" / f"{job.pk}.log", port=None,
                              role="builder")
    _Watch(job, record).run()


def builder_slot(job: QuantizationJob) -> str:
    return f"build-{job.pk}"


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
    # Added to the supervisor's environment when it spawns the builder.
    return {"PYTHONPATH": str(settings.BASE_DIR), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


class _Watch:
    """Follows the builder's log into the job row until it exits or the job is cancelled."""

    def __init__(self, job: QuantizationJob, record: ManagedProcess) -> None:
        self.job, self.record = job, record
        self.log: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self.progress: dict[str, Any] = {}
        self.outcome: dict[str, Any] = {}
        self._file: IO[str] | None = None
        self._partial = ""
        self._pickup_by = time.monotonic() + process_requests.PICKUP_TIMEOUT_S

    def run(self) -> None:
        try:
            while True:
                self._read_new_lines()
                if self._beat():
                    self._cancel()
                    return
                self.record.refresh_from_db()
                if self.record.pid and self.job.pid != self.record.pid:
                    self.job.pid = self.record.pid
                    QuantizationJob.objects.filter(pk=self.job.pk).update(pid=self.record.pid)
                if process_requests.ended(self.record):
                    break  # it exited: the supervisor recorded how
                if self.record.started_at is None and time.monotonic() > self._pickup_by:
                    process_requests.release(self.record)
                    _finish(self.job, State.FAILED,
                            error=f"no supervisor started the builder within "
                                  f"{process_requests.PICKUP_TIMEOUT_S:.0f} s; "
                                  "is `manage.py supervise` running?")
                    return
                time.sleep(HEARTBEAT_S)
            self._read_new_lines(final=True)
            self._beat()
            self._conclude()
        finally:
            if self._file is not None:
                self._file.close()

    def _read_new_lines(self, final: bool = False) -> None:
        if self._file is None:
            try:
                # newline="": a progress bar's carriage returns stay in the line, not new lines.
                self._file = open(self.record.log_path, encoding="utf-8", errors="replace",  # noqa: SIM115
                                  newline="")
            except FileNotFoundError:
                return  # not spawned yet
        data = self._partial + self._file.read()
        lines = data.split("\n")
        # The last piece is a line still being written, unless the builder has exited.
        self._partial = "" if final else lines.pop()
        for line in lines:
            if not line.startswith("=== pdserve "):  # the supervisor's header line
                self._take(line)

    def _take(self, line: str) -> None:
        # The builder's stdout (events) and stderr (log) share the supervisor's pipe, so an
        # event may follow a progress bar's frame on the same line: it starts at EVENT_START.
        text, found, event_text = line.rstrip("\r").partition(EVENT_START)
        event = parse(found + event_text) if found else None
        if found and event is None:
            text = line  # not one of ours after all: log it whole
        # tqdm redraws with carriage returns: keep the last state of the bar.
        text = text.split("\r")[-1].rstrip()
        if text:
            self.log.append(text)
        if event is None:
            return
        if event["event"] == "progress":
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
        process_requests.release(self.record)
        remove_outputs(self.job)
        _finish(self.job, State.CANCELLED, log="\n".join(self.log))

    def _conclude(self) -> None:
        log = "\n".join(self.log)
        code = self.record.exit_code
        if code != 0 or self.outcome.get("event") != "done":
            remove_outputs(self.job)
            error = self.outcome.get("error") or (
                f"the builder exited with status {code}: " + "\n".join(list(self.log)[-5:])
                if code is not None else f"the builder could not run: {self.record.last_error}")
            _finish(self.job, State.FAILED, error=error, log=log)
            return
        try:
            # The built variant joins the catalog as the job's doing, not the Celery worker's.
            with acting_as("system", "quantization"), transaction.atomic():
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
    """Fail running jobs whose worker stopped beating, and remove what their builder wrote. A
    builder still running is released first (the supervisor stops it) and the job is failed on
    a later round, once it is gone, so no file is removed under a running builder."""
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    reaped = 0
    for job in QuantizationJob.objects.filter(state=State.RUNNING, heartbeat_at__lt=cutoff):
        builder = ManagedProcess.objects.filter(deployment=None, slot=builder_slot(job)).first()
        if builder is not None and builder.state in ManagedProcess.ALIVE_STATES:
            ManagedProcess.objects.filter(pk=builder.pk).update(wanted=ManagedProcess.Wanted.STOPPED)
            continue
        remove_outputs(job)
        reaped += QuantizationJob.objects.filter(pk=job.pk, state=State.RUNNING).update(
            state=State.FAILED, finished_at=timezone.now(), stage="failed",
            error="the job's worker stopped while building (killed or crashed); "
                  "its files were removed")
    return reaped


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
