"""The builder's progress protocol: one JSON object per stdout line.

``{"event": "progress", "stage": "calibrate", "percent": 41.5, "detail": "..."}`` while it
works, then ``{"event": "done", "path": ..., "seconds": ..., ...}`` or
``{"event": "error", "flag": "--group-size" | null, "error": "..."}``. Logs go to stderr.
The console reads these lines with ``parse``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

# Where each stage starts and ends on the overall percent scale.
STAGES: dict[str, tuple[float, float]] = {
    "prepare": (0, 2), "load": (2, 10), "calibrate": (10, 90), "save": (90, 97),
    "finish": (97, 100),
}


@dataclass
class Reporter:
    """Writes progress lines; at most one line per ``min_interval_s`` within a stage."""

    stream: TextIO
    min_interval_s: float = 0.25
    _last_at: float = field(default=0.0, init=False)
    _last_percent: float = field(default=-1.0, init=False)

    def stage(self, stage: str, fraction: float = 0.0, detail: str = "", *, force: bool = True) -> None:
        start, end = STAGES[stage]
        percent = round(start + (end - start) * min(max(fraction, 0.0), 1.0), 1)
        now = time.monotonic()
        if not force and (now - self._last_at < self.min_interval_s or percent <= self._last_percent):
            return
        self._last_at, self._last_percent = now, max(percent, self._last_percent)
        self._emit({"event": "progress", "stage": stage, "percent": self._last_percent,
                    "detail": detail})

    def done(self, **facts: Any) -> None:
        self._emit({"event": "done", "percent": 100.0, **facts})

    def error(self, message: str, flag: str | None = None) -> None:
        self._emit({"event": "error", "flag": flag, "error": message})

    def _emit(self, payload: dict[str, Any]) -> None:
        self.stream.write(json.dumps(payload) + "\n")
        self.stream.flush()


def parse(line: str) -> dict[str, Any] | None:
    """A progress event from one stdout line, or None for anything else."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(event, dict) or event.get("event") not in ("progress", "done", "error"):
        return None
    return event
