from __future__ import annotations

from console.celery import app
from console.quality.measure import run_measurement


@app.task(name="quality.measure_variant", ignore_result=True)
def measure_variant(measurement_id: int) -> None:
    run_measurement(measurement_id)
