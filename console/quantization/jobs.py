"""Quantization jobs as the console asks for them: starting and cancelling."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.entries import record, snapshot
from console.catalog.models import BaseModel, QuantizationJob, Variant
from console.celery import queue_or_mark
from console.quantization.builder import quantize_variant, reap_orphans
from inference.quantization.calibration import DEFAULT_FILE
from inference.quantization.options import (
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_SAMPLES,
    OptionError,
    default_method,
    resolve,
)

State = QuantizationJob.State
# What the audit log shows of a job: what was asked for, and whether it was cancelled.
JOB_FIELDS = ("base", "source", "name", "path", "scheme", "method", "group_size",
              "smoothing_strength", "samples", "state", "cancel_requested")
# The builder's flags, as the API's fields.
FIELDS = {"--model": "source", "--scheme": "scheme", "--method": "method",
          "--group-size": "group_size", "--smoothing-strength": "smoothing_strength",
          "--samples": "samples", "--out": "name"}


class JobError(ValueError):
    """A job that cannot be started or changed; ``field`` names the input, ``conflict`` is a 409."""

    def __init__(self, field: str, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.conflict = conflict


def start_job(base: BaseModel, *, scheme: str, method: str | None = None,
              group_size: int | None = None, smoothing_strength: float | None = None,
              name: str = "", source: Variant | None = None,
              samples: int = DEFAULT_SAMPLES) -> QuantizationJob:
    """Check the request against the source model, record the job and queue it after commit."""
    source = source or default_source(base)
    if source.base_id != base.pk:
        raise JobError("source", f"{source} is not a variant of {base.name}")
    if source.quantization:
        raise JobError("source", f"{source} is already quantized ({source.quantization})")
    method = method or default_method(scheme)
    name = name or f"{scheme}-{method}"
    path = settings.PDSERVE_MODEL_DIR / f"{base.name}-{name}"
    _refuse_conflicts(base, name, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        options = resolve(model=Path(source.path), out=path, scheme=scheme, method=method,
                          group_size=group_size, smoothing_strength=smoothing_strength,
                          samples=samples, max_seq_len=DEFAULT_MAX_SEQ_LEN, calibration=DEFAULT_FILE)
    except OptionError as exc:
        raise JobError(FIELDS.get(exc.flag, "non_field_errors"), str(exc).removeprefix(f"{exc.flag}: "),
                       conflict=exc.flag == "--out") from exc
    with transaction.atomic():
        job = QuantizationJob.objects.create(
            base=base, source=source, name=name, path=str(path), scheme=options.scheme,
            method=options.method, group_size=options.group_size,
            smoothing_strength=options.smoothing_strength, samples=options.samples)
        record("job.start", job, after=snapshot(job, JOB_FIELDS))
        transaction.on_commit(partial(_send, job.pk))
    return job


def default_source(base: BaseModel) -> Variant:
    """The variant to quantize when none is named: an inspected, unquantized one (bf16 first)."""
    candidates = [v for v in base.variants.all() if v.inspected and not v.quantization]
    if not candidates:
        raise JobError("source", f"{base.name} has no inspected unquantized variant to quantize")
    return min(candidates, key=lambda v: (v.name != "bf16", v.name))


def _refuse_conflicts(base: BaseModel, name: str, path: Path) -> None:
    if Variant.objects.filter(base=base, name=name).exists():
        raise JobError("name", f"{base.name} already has a variant named {name}", conflict=True)
    if QuantizationJob.objects.filter(base=base, name=name, state__in=QuantizationJob.ACTIVE_STATES).exists():
        raise JobError("name", f"a job is already building {base.name}/{name}", conflict=True)
    if Variant.objects.filter(path=str(path)).exists() or path.exists():
        raise JobError("name", f"{path} already exists", conflict=True)


def _send(job_id: int) -> None:
    queue_or_mark(quantize_variant, job_id, QuantizationJob.objects.filter(state=State.QUEUED),
                  state=State.FAILED, finished_at=timezone.now())


def cancel_job(job: QuantizationJob) -> QuantizationJob:
    """A queued job is cancelled at once; a running one when its worker next looks (~0.5 s)."""
    reap_orphans()
    with transaction.atomic():
        job.refresh_from_db()
        before = snapshot(job, ("state", "cancel_requested"))
        if QuantizationJob.objects.filter(pk=job.pk, state=State.QUEUED).update(
                state=State.CANCELLED, finished_at=timezone.now(), stage="cancelled"):
            pass
        elif not QuantizationJob.objects.filter(pk=job.pk, state=State.RUNNING).update(
                cancel_requested=True):
            job.refresh_from_db()
            raise JobError("state", f"the job has already {job.state}", conflict=True)
        job.refresh_from_db()
        record("job.cancel", job, before=before,
               after=snapshot(job, ("state", "cancel_requested")))
    return job
