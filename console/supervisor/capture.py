"""A line a supervised process printed, as the supervisor captures it for the log store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# Lines longer than this are cut: a runaway progress bar must not fill the database.
MAX_LINE_CHARS = 4096


@dataclass(frozen=True)
class CapturedLine:
    process_id: int
    text: str
    created: datetime


def clean_line(raw: bytes) -> str:
    """One line as written by a process: decoded, without its newline, and, for progress
    bars that redraw with carriage returns, only the last drawing."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if "\r" in text:
        parts = [part for part in text.split("\r") if part.strip()]
        text = parts[-1] if parts else ""
    return text[:MAX_LINE_CHARS]
