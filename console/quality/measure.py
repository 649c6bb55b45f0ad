"""The "measure variant on node" job: serve one variant alone, measure its prefill and decode
speed, and gate it against the base model's unquantized variant.

One vLLM server at a time: the reference answers the gate's prompts first and is stopped, then
the variant is started, timed and scored against those answers.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import asdict
from functools import partial
from pathlib import Path

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.audit.entries import record, snapshot
from console.catalog.models import Variant
from console.celery import app, queue_or_mark
from console.fleet.models import Node
from console.quality.models import VariantMeasurement
from console.quality.servers import served
from console.quality.services import original_variant
from console.supervisor.models import ManagedProcess
from console.supervisor.process_requests import ProcessFailed, this_process
from console.supervisor.worker_keys import process_key
from inference.launch import LaunchError
from inference.output_gate import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_PROMPTS,
    GateError,
    ReferenceServer,
    load_prompts,
    reference_answers,
    run_gate,
)
from inference.process_groups import is_same_process
from inference.reference_cache import ReferenceAnswers
from inference.variant_speed import measure as measure_speed
from inference.worker_auth import bearer

log = logging.getLogger("pdserve.quality")
State = VariantMeasurement.State
PREFILL_TOKENS = 512


class MeasureRefused(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def base_reference(variant: Variant) -> Variant | None:
    """What a variant is gated against: its base model's original unquantized variant."""
    return original_variant(variant.base_id)


def queue_measurement(variant: Variant, node: Node, dtype: str = "bfloat16") -> VariantMeasurement:
    if not node.is_local:
        raise MeasureRefused("node", f"{node.name}: pdserve starts vLLM only on the local node "
                                     "until node agents exist")
    if not variant.inspected:
        raise MeasureRefused("variant", f"{variant} has not been inspected")
    if base_reference(variant) is None:
        raise MeasureRefused("variant", f"{variant.base.name} has no unquantized variant to gate "
                                        "against; register one")
    if VariantMeasurement.objects.filter(variant=variant, node=node,
                                         state__in=(State.QUEUED, State.RUNNING)).exists():
        raise MeasureRefused("variant", f"{variant} is already being measured on {node.name}")
    with transaction.atomic():
        measurement = VariantMeasurement.objects.create(
            variant=variant, node=node, dtype=dtype,
            cores=str(node.cpu_ids[-1]) if node.cpu_ids else "")
        record("measurement.start", measurement,
               after=snapshot(measurement, ("variant", "node", "dtype", "cores")))
    transaction.on_commit(partial(_send, measurement.pk))
    return measurement


def _send(measurement_id: int) -> None:
    queue_or_mark(measure_variant, measurement_id, VariantMeasurement.objects.all(),
                  state=State.FAILED)


@app.task(name="quality.measure_variant", ignore_result=True)
def measure_variant(measurement_id: int) -> None:
    run_measurement(measurement_id)


def run_measurement(measurement_id: int) -> VariantMeasurement:
    measurement = VariantMeasurement.objects.select_related("variant__base", "node").get(
        pk=measurement_id)
    worker_pid, worker_started_at = this_process()
    VariantMeasurement.objects.filter(pk=measurement_id).update(
        state=State.RUNNING, worker_pid=worker_pid, worker_started_at=worker_started_at)
    try:
        fields = _measure(measurement)
        fields.update(state=State.DONE)
    except (GateError, LaunchError, ProcessFailed, OSError, httpx.HTTPError) as exc:
        fields = {"state": State.FAILED, "error": str(exc)[:1000]}
    except Exception as exc:  # the row must not stay "running", whatever happened
        log.exception("measurement #%d crashed", measurement_id)
        fields = {"state": State.FAILED, "error": f"the measurement crashed: {exc!r}"[:1000]}
    VariantMeasurement.objects.filter(pk=measurement_id).update(finished_at=timezone.now(), **fields)
    measurement.refresh_from_db()
    return measurement


def _measure(measurement: VariantMeasurement) -> dict[str, object]:
    variant = measurement.variant
    reference = base_reference(variant)
    if reference is None:
        raise GateError(f"{variant.base.name} has no unquantized variant to gate against")
    cores = tuple(int(c) for c in measurement.cores.split(",") if c)
    log_dir = Path(settings.PDSERVE_LOG_DIR) / "measurements"
    log_dir.mkdir(parents=True, exist_ok=True)

    def server(path: str, part: str, name: str) -> AbstractContextManager[ManagedProcess]:
        """One vLLM server of the measurement (``part``: reference or variant)."""
        return served(ReferenceServer(model_path=path, port=0, dtype=measurement.dtype, cores=cores,
                                      cache_dir=str(settings.PDSERVE_CACHE_DIR),
                                      enforce_eager=settings.PDSERVE_ENFORCE_EAGER),
                      ManagedProcess.Kind.MEASUREMENT, f"measure-{measurement.pk}-{part}",
                      log_dir / f"{measurement.pk}-{name}.log")

    prompts = load_prompts(DEFAULT_PROMPTS)
    # The reference's answers, kept from an earlier gate or measurement of this base model
    # (inference/reference_cache.py): then no reference server starts.
    kept = ReferenceAnswers(settings.PDSERVE_CACHE_DIR, reference.path, dtype=measurement.dtype,
                            enforce_eager=settings.PDSERVE_ENFORCE_EAGER,
                            max_tokens=DEFAULT_MAX_TOKENS)
    answers = kept.get(prompts)
    if answers is None and reference.pk != variant.pk:
        with server(reference.path, "reference", "reference") as process, \
                httpx.Client(timeout=300, headers=bearer(process_key(process))) as client:
            answers = reference_answers(client, process.url, prompts, DEFAULT_MAX_TOKENS)
        kept.put(prompts, answers)
    with server(variant.path, "variant", variant.name) as process:
        url, key = process.url, process_key(process)
        if answers is None:  # the variant is the reference: it answers and is scored itself
            with httpx.Client(timeout=300, headers=bearer(key)) as client:
                answers = reference_answers(client, url, prompts, DEFAULT_MAX_TOKENS)
            kept.put(prompts, answers)
        speed = measure_speed(url, PREFILL_TOKENS, key=key)
        report = run_gate(url, {str(variant): url}, prompts, answers=answers, keys={url: key})
    return {"reference": f"{reference} ({measurement.dtype})", "prompt_tokens": speed.prefill_tokens,
            "prefill_tps": round(speed.prefill_tps, 1), "decode_tps": round(speed.decode_tps, 2),
            "gate": {**report.as_dict(), "speed": asdict(speed)}}


def reap_orphans() -> int:
    """Fail running measurements whose Celery worker is gone (killed mid-run): nobody else will
    finish their rows, and a variant with a running measurement cannot be measured again. Their
    vLLM servers are stopped by the supervisor, whose reason is quoted: a measurement is failed
    on a later round once they are gone, as a quantization job is."""
    reaped = 0
    for measurement in VariantMeasurement.objects.filter(state=State.RUNNING):
        if is_same_process(measurement.worker_pid, measurement.worker_started_at):
            continue
        servers = list(ManagedProcess.objects.filter(
            deployment=None, slot__startswith=f"measure-{measurement.pk}-"))
        # The supervisor (the same daemon, before this in its tick) stops a server whose
        # requester died and writes why once it has exited; read before that, the reason was
        # missing (CI: the row read between the signal and the exit).
        if any(p.state in ManagedProcess.ALIVE_STATES for p in servers):
            continue
        reason = "; ".join(f"{p.slot}: {p.last_error}" for p in servers if p.last_error)
        error = f"its Celery worker (pid {measurement.worker_pid}) stopped mid-run" + \
            (f" ({reason})" if reason else "")
        reaped += VariantMeasurement.objects.filter(pk=measurement.pk, state=State.RUNNING).update(
            state=State.FAILED, error=error[:1000], finished_at=timezone.now())
    return reaped
