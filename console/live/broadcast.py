"""From stored rows to websocket messages."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from console.live.groups import deployment_group, emit, process_group
from console.live.models import LogLine, MetricSample

# Under a flood a message carries only the newest lines of a tick; the browser sees the jump
# in sequence numbers and fetches the skipped lines over REST. Nothing stored is lost.
MAX_LINES_PER_MESSAGE = 200


def log_messages(lines: Iterable[LogLine]) -> list[tuple[str, dict[str, Any]]]:
    by_process: dict[int, list[LogLine]] = defaultdict(list)
    for line in lines:
        by_process[line.process_id].append(line)
    messages = []
    for process_id, rows in by_process.items():
        rows = rows[-MAX_LINES_PER_MESSAGE:]
        messages.append((process_group(process_id), {
            "type": "log",
            "process": process_id,
            "lines": [[row.seq, row.created.isoformat(), row.text] for row in rows],
        }))
    return messages


def metric_messages(samples: Iterable[MetricSample]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (deployment_group(sample.deployment_id), {
            "type": "metrics",
            "deployment": sample.deployment_id,
            "at": sample.created.isoformat(),
            "data": sample.data,
        })
        for sample in samples
    ]


async def send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    for group, payload in messages:
        await emit(group, payload)
