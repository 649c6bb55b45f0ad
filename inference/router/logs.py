"""The router process's logging: one line per record on stderr, as basicConfig would write
it, at a cost fit for the timeline line every request logs (hot path: once per request)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class SecondsFormatter(logging.Formatter):
    """The default timestamp (``2026-12-06 03:40:31,123``), its date and time formatted once a
    second rather than for every record."""

    def __init__(self, fmt: str):
        super().__init__(fmt)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return self.default_msec_format % (self._stamp, record.msecs)


class LoopBatchingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the records logged in one turn of the event loop with one write at its end,
    rather than a write (a system call, stderr being line-buffered) per record; the lines and
    their order are the same. Records from other threads, and any left when logging shuts
    down, are written at once."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # logging's own contract: a bad record is reported, not raised
            self.handleError(record)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pending.append(line)
            self.flush()
            return
        self._pending.append(line)
        if len(self._pending) == 1:
            loop.call_soon(self._flush_batch)

    def _flush_batch(self) -> None:
        try:
            self.flush()
        except (OSError, ValueError):
            # stderr itself is gone (closed, a broken pipe): there is nowhere to say so, and
            # logging's own handleError gives up the same way.
            self._pending.clear()

    def flush(self) -> None:
        self.acquire()
        try:
            if self._pending:
                lines, self._pending = "".join(self._pending), []
                self.stream.write(lines)
            self.stream.flush()
        finally:
            self.release()


def configure() -> None:
    handler = LoopBatchingHandler()
    handler.setFormatter(SecondsFormatter(FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # Spare each record what the format never prints (a walk up the stack for the caller,
    # thread and process names), as the logging HOWTO's "Optimization" section suggests.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
