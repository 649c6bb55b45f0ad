"""Autoscaling rows as websocket messages for the console's hub (embedded mode): the decisions
and pool readings the autoscaler stored in the supervisor's process, sent on the deployment's
socket (group ``deployment-<id>``) as console/autoscaling/scaling_messages.py shapes them. With Redis the
autoscaler sends them itself and the hub does not run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Max

from console.autoscaling.models import PoolReading, ScalingDecision
from console.autoscaling.scaling_messages import decision_message, reading_message
from console.live.groups import deployment_group

Message = tuple[str, dict[str, Any]]

# Rows per poll of each kind; the rest come with the next poll, 0.1 s later.
BATCH = 500


class ScalingSource:
    """Decisions saved since the last poll, new or changed (a decision is extended and its
    progress followed after it is stored), and the readings stored since."""

    def __init__(self) -> None:
        # None: the table was empty at the start, so every row is new.
        self.last_changed: datetime | None = None
        self.last_reading_id = 0

    def start_from_now(self) -> None:
        self.last_changed = ScalingDecision.objects.aggregate(m=Max("changed"))["m"]
        self.last_reading_id = PoolReading.objects.aggregate(m=Max("id"))["m"] or 0

    def fetch(self) -> list[Message]:
        readings = list(PoolReading.objects.filter(id__gt=self.last_reading_id)
                        .order_by("id")[:BATCH])
        if readings:
            self.last_reading_id = readings[-1].id
        decisions = ScalingDecision.objects.all()
        if self.last_changed is not None:
            decisions = decisions.filter(changed__gt=self.last_changed)
        changed = list(decisions.order_by("changed", "id")[:BATCH])
        if changed:
            self.last_changed = changed[-1].changed
        return ([(deployment_group(r.deployment_id), reading_message(r)) for r in readings]
                + [(deployment_group(d.deployment_id), decision_message(d)) for d in changed])
