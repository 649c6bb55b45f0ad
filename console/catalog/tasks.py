from __future__ import annotations

from celery.signals import worker_ready

from console.catalog.hashing import hash_weights
from console.celery import app


@app.task(name="catalog.hash_variant_weights", ignore_result=True)
def hash_variant_weights(variant_id: int, job: str) -> None:
    hash_weights(variant_id, job)


@app.task(name="catalog.quantize_variant", ignore_result=True)
def quantize_variant(job_id: int) -> None:
    # Imported here: the builder registers variants through services, which imports this module.
    from console.catalog.builder import run_job

    run_job(job_id)


@worker_ready.connect
def fail_orphaned_jobs(**_: object) -> None:
    # A worker that was killed mid-build left its job "running": this worker cannot be running
    # it, so any such job whose heartbeat stopped is failed and its files removed.
    from console.catalog.jobs import STALE_AT_WORKER_START_S, reap_orphans

    reap_orphans(STALE_AT_WORKER_START_S)
