"""Finding one request across the router's timeline line and the workers' log lines."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from console.live.models import LogLine

TIMELINE_PREFIX = "timeline "


@dataclass
class RequestView:
    request_id: str
    timeline: dict[str, Any] | None = None
    # (process slot, log line) pairs from every process of the deployment, in time order
    lines: list[tuple[str, LogLine]] = field(default_factory=list)

    def steps(self) -> list[tuple[str, float, float | None]]:
        """(event, ms since arrival, ms since the previous event), in time order."""
        if not self.timeline:
            return []
        events = sorted(self.timeline["events_ms"].items(), key=lambda item: item[1])
        steps = []
        previous: float | None = None
        for name, at in events:
            steps.append((name, at, None if previous is None else round(at - previous, 3)))
            previous = at
        return steps


def find_request(deployment_id: int, request_id: str, limit: int = 200) -> RequestView:
    view = RequestView(request_id=request_id)
    lines = (LogLine.objects.filter(process__deployment_id=deployment_id,
                                    text__contains=request_id)
             .select_related("process").order_by("created", "seq")[:limit])
    for line in lines:
        marker = line.text.find(TIMELINE_PREFIX + "{")
        if line.process.role == "router" and marker >= 0:
            try:
                parsed = json.loads(line.text[marker + len(TIMELINE_PREFIX):])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and parsed.get("request_id") == request_id:
                view.timeline = parsed
                continue
        view.lines.append((line.process.slot, line))
    return view
