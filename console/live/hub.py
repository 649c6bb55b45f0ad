"""The broadcaster for the embedded mode.

With the in-memory channel layer only the console's own process can reach its sockets, so the
console polls the database for rows the supervisor stored and broadcasts them. With REDIS_URL
set the supervisor broadcasts right after storing, and this hub is not started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Max

from console.live.broadcast import log_messages, metric_messages, send_all
from console.live.models import LogLine, MetricSample

log = logging.getLogger("pdserve.live")

Message = tuple[str, dict[str, Any]]


class HubSource(Protocol):
    """Rows a later app stores that the hub broadcasts too (alerts register theirs: live may
    not import them)."""

    def start_from_now(self) -> None: ...

    def fetch(self) -> list[Message]: ...


SOURCES: list[Callable[[], HubSource]] = []


def register_source(factory: Callable[[], HubSource]) -> None:
    if factory not in SOURCES:
        SOURCES.append(factory)


@dataclass
class LiveHub:
    interval_s: float = 0.1
    last_line_id: int = 0
    last_sample_id: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    sources: list[HubSource] = field(default_factory=list, repr=False)

    def ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        # A task of another (finished) event loop never runs again: start one on this loop.
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self.run())

    async def run(self) -> None:
        await database_sync_to_async(self._start_from_now)()
        while True:
            try:
                lines, samples = await database_sync_to_async(self._fetch)()
                extra = await database_sync_to_async(self._fetch_sources)()
                await send_all(log_messages(lines) + metric_messages(samples) + extra)
            except Exception:  # keep broadcasting after a transient database error
                log.exception("live hub tick failed")
            await asyncio.sleep(self.interval_s)

    def _start_from_now(self) -> None:
        # Sockets backfill history over REST; the hub only carries what is new.
        self.last_line_id = LogLine.objects.aggregate(m=Max("id"))["m"] or 0
        self.last_sample_id = MetricSample.objects.aggregate(m=Max("id"))["m"] or 0
        self.sources = [factory() for factory in SOURCES]
        for source in self.sources:
            source.start_from_now()

    def _fetch_sources(self) -> list[Message]:
        return [message for source in self.sources for message in source.fetch()]

    def _fetch(self) -> tuple[list[LogLine], list[MetricSample]]:
        lines = list(LogLine.objects.filter(id__gt=self.last_line_id).order_by("id")[:5000])
        if lines:
            self.last_line_id = lines[-1].id
        samples = list(MetricSample.objects.filter(
            id__gt=self.last_sample_id, resolution=MetricSample.Resolution.SECOND
        ).order_by("id")[:500])
        if samples:
            self.last_sample_id = samples[-1].id
        return lines, samples


# One hub per console process: the process's sockets share it.
HUB = LiveHub()


def ensure_hub() -> None:
    if not settings.REDIS_URL:
        HUB.ensure_started()
