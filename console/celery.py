"""pdserve's Celery app: background jobs of the console (hashing model weights, measuring variants).

Run a worker with ``celery -A console.celery worker --pool solo --concurrency 1``. The broker is
a directory under the data directory unless REDIS_URL is set (console/settings.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task
from django.conf import settings
from django.db.models import QuerySet

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("pdserve")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The modules that define tasks, imported when a worker starts.
app.conf.imports = ("console.catalog.hashing", "console.quantization.builder", "console.quality.measure",
                    "console.verification.execution", "console.advisor.speed_runs")
# The tasks node agents run, which `manage.py agent` registers itself.
AGENT_TASK_MODULES = ("console.catalog.copies", "console.control.agent_tasks",
                      "console.fleet.agent_calls")

# The filesystem transport expects its folders to exist, in the sender as in the worker.
for _key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
    _folder = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}).get(_key)
    if _folder:
        Path(_folder).mkdir(parents=True, exist_ok=True)
if str(getattr(settings, "CELERY_RESULT_BACKEND", "")).startswith("file://"):
    Path(settings.CELERY_RESULT_BACKEND.removeprefix("file://")).mkdir(parents=True, exist_ok=True)


log = logging.getLogger("pdserve.jobs")


def queue_or_mark(task: Task, row_id: int, rows: QuerySet[Any], **failed: Any) -> None:
    """Queue ``task`` for the row ``row_id`` of ``rows``. A broker that cannot be reached must
    not leave the row waiting for a job that never comes: the row gets ``failed`` and the
    error instead."""
    try:
        task.delay(row_id)
    except Exception as exc:  # each kombu transport fails in its own way
        log.warning("could not queue %s for row %s: %s", task.name, row_id, exc)
        rows.filter(pk=row_id).update(error=f"could not queue the job: {exc}"[:1000], **failed)
