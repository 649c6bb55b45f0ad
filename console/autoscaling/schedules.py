"""Scheduled capacity: cron-like windows that raise a pool's minimum for known peaks.

A window opens at each time its cron expression names and stays open for ``duration_s``; while
any window is open, the pool's minimum is the largest ``min_instances`` of the open ones.
Expressions are read by cronsim (five fields, as cron and healthchecks.io read them), in the
window's ``timezone`` (IANA name; UTC when left out).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.core.exceptions import ValidationError

KEYS = {"name", "cron", "duration_s", "min_instances", "timezone"}
MAX_WINDOWS = 20
MAX_DURATION_S = 7 * 86_400


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(f"timezone: unknown zone {name!r}") from exc


def validate_schedules(value: object) -> None:
    if not isinstance(value, list):
        raise ValidationError('expected a list such as [{"cron": "0 8 * * 1-5", '
                              '"duration_s": 7200, "min_instances": 2}]')
    if len(value) > MAX_WINDOWS:
        raise ValidationError(f"at most {MAX_WINDOWS} windows")
    for index, window in enumerate(value):
        if not isinstance(window, dict):
            raise ValidationError(f"{index}: expected an object")
        unknown = set(window) - KEYS
        if unknown:
            raise ValidationError(f"{index}: unknown key(s) {', '.join(sorted(unknown))}; "
                                  f"known: {', '.join(sorted(KEYS))}")
        cron = window.get("cron")
        if not isinstance(cron, str):
            raise ValidationError(f"{index}.cron: expected a cron expression such as "
                                  '"0 8 * * 1-5"')
        try:
            CronSim(cron, datetime(2026, 1, 1))
        except CronSimError as exc:
            raise ValidationError(f"{index}.cron: {cron!r} is not a cron expression ({exc})"
                                  ) from exc
        duration = window.get("duration_s")
        if isinstance(duration, bool) or not isinstance(duration, int) or not (
                60 <= duration <= MAX_DURATION_S):
            raise ValidationError(f"{index}.duration_s: expected whole seconds from 60 to "
                                  f"{MAX_DURATION_S}")
        minimum = window.get("min_instances")
        if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
            raise ValidationError(f"{index}.min_instances: expected a whole number from 1")
        if not isinstance(window.get("name", ""), str):
            raise ValidationError(f"{index}.name: expected text")
        try:
            _zone(window.get("timezone", "UTC"))
        except ValidationError as exc:
            raise ValidationError(f"{index}.{exc.messages[0]}") from exc


def opened_at(window: dict[str, Any], now: datetime) -> datetime | None:
    """When the window now open opened, or None when it is closed. ``now`` is aware."""
    zone = _zone(window.get("timezone", "UTC"))
    now_utc = now.astimezone(UTC)
    duration = timedelta(seconds=window["duration_s"])
    # The window lasts duration_s of elapsed time: its start and the comparison are instants,
    # since wall-clock arithmetic would make a window over a DST change an hour short or long.
    # cronsim yields the first match after an aware start, reading the expression in the
    # start's zone as Debian's cron does (a time the change skips runs just after it).
    first = next(CronSim(window["cron"], (now_utc - duration).astimezone(zone)))
    return first if first.astimezone(UTC) <= now_utc else None


def scheduled_minimum(schedules: list[dict[str, Any]], now: datetime) -> tuple[int, str]:
    """The largest minimum among the windows open at ``now`` (0 when none) and its name."""
    best, name = 0, ""
    for index, window in enumerate(schedules):
        if opened_at(window, now) is not None and window["min_instances"] > best:
            best, name = window["min_instances"], window.get("name") or f"window {index}"
    return best, name
