from __future__ import annotations

from console.catalog.hashing import hash_weights
from console.celery import app


@app.task(name="catalog.hash_variant_weights", ignore_result=True)
def hash_variant_weights(variant_id: int, job: str) -> None:
    hash_weights(variant_id, job)
