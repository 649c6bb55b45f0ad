"""pdserve's Celery app: background jobs of the console (hashing model weights, measuring variants).

Run a worker with ``celery -A console.celery worker --pool solo --concurrency 1``. The broker is
a directory under the data directory unless REDIS_URL is set (console/settings.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery
from django.conf import settings

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
