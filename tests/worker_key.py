"""The header a test sends to a worker the console's supervisor (or a node agent) started:
its deployment's key, derived from the console's secret key as console/supervisor/worker_keys.py
does (PDSERVE_SECRET_KEY, else the one generated into the data directory)."""

from __future__ import annotations

import os
from pathlib import Path

from inference.worker_auth import bearer, derive_key


def worker_headers(data_dir: Path, deployment: str, env: dict[str, str] | None = None) -> dict[str, str]:
    secret = (env if env is not None else os.environ).get("PDSERVE_SECRET_KEY") \
        or (data_dir / "secret_key").read_text().strip()
    return bearer(derive_key(secret, "worker", deployment))
