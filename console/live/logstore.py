"""Storing captured log lines: sequence numbers, batching, bounded retention."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Max

from console.live.models import LogLine
from console.supervisor.capture import CapturedLine


@dataclass
class LogStore:
    """The single writer of LogLine rows (the supervisor), so sequence numbers are kept here."""

    retention_lines: int = 50_000
    _next_seq: dict[int, int] = field(default_factory=dict)

    def write(self, batch: Iterable[CapturedLine]) -> list[LogLine]:
        rows = [
            LogLine(process_id=line.process_id, seq=self._take_seq(line.process_id),
                    created=line.created, text=line.text)
            for line in batch
        ]
        if rows:
            LogLine.objects.bulk_create(rows)
        return rows

    def prune(self) -> int:
        """Delete lines beyond the retention of each process; returns how many went."""
        removed = 0
        for process_id, last in self._next_seq.items():
            cutoff = last - self.retention_lines
            if cutoff > 0:
                removed += LogLine.objects.filter(process_id=process_id, seq__lte=cutoff).delete()[0]
        return removed

    def _take_seq(self, process_id: int) -> int:
        if process_id not in self._next_seq:
            last = LogLine.objects.filter(process_id=process_id).aggregate(m=Max("seq"))["m"]
            self._next_seq[process_id] = last or 0
        self._next_seq[process_id] += 1
        return self._next_seq[process_id]
