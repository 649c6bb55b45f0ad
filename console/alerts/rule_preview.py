"""Rule preview: when an unsaved rule would have fired over the last hour."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from console.alerts import rule_states
from console.alerts import series as catalog
from console.alerts.evaluation import SECOND, TICK_S
from console.alerts.models import AlertRule, AlertState, Fact
from console.alerts.snapshots import expected, frame, grouped
from console.fleet.services import local_node
from console.live.models import MetricSample

PREVIEW_S = 3600.0
PREVIEW_POINTS = 240


def preview(rule: AlertRule, now: datetime, span_s: float = PREVIEW_S) -> dict[str, Any]:
    """When an (unsaved) rule would have fired over the last ``span_s``: each instance's
    transitions, replayed every tick over the stored 1 s snapshots, and its series thinned for
    a chart. Facts that only the evaluator sees (gate, ports, missing metrics) have their
    stored history of one value, so their preview shows the present."""
    definition = catalog.get(rule.series)
    spec = rule_states.RuleSpec(
        comparison=rule.comparison, threshold=rule.threshold, for_s=rule.for_s,
        keep_firing_for_s=rule.keep_firing_for_s, min_count=rule.min_count, nodata=rule.nodata)
    deployment = rule.deployment
    start = now.timestamp() - span_s
    planned = {w.slot: w for w in deployment.workers.select_related("node")}
    memory = {slot: worker.node.memory_bytes for slot, worker in planned.items()}
    memory["router"] = local_node().memory_bytes
    frames: list[catalog.Frame] = []
    since = datetime.fromtimestamp(start - rule.window_s, tz=UTC)
    seconds = MetricSample.objects.filter(deployment=deployment, resolution=SECOND,
                                          created__gt=since, created__lte=now)
    first_second = seconds.order_by("created").values_list("created", flat=True).first() or now
    # 1 s samples are kept for 15 minutes (console/live/downsample.py); before them, the
    # minutes' means stand in.
    minutes = MetricSample.objects.filter(deployment=deployment,
                                          resolution=MetricSample.Resolution.MINUTE,
                                          created__gt=since, created__lt=first_second)
    rows = [*minutes.order_by("created").values_list("created", "data"),
            *seconds.order_by("created").values_list("created", "data")]
    for created, data in rows:
        frames.append(frame(created.timestamp(), data.get("processes", {}), planned, set(),
                             memory, frames[-1] if frames else None))
    frames += [catalog.Frame(fact.at.timestamp(), {}, {fact.series: fact.value})
               for fact in Fact.objects.filter(deployment=deployment, series=rule.series)]
    groups = grouped(definition, catalog.instance_points(definition, frames, rule.role),
                      rule.scope)
    for key in expected(definition, rule, planned, set()):
        groups.setdefault(key, [])  # an instance without data shows as NoData
    instances = []
    for (role, slot), points in sorted(groups.items()):
        transitions = rule_states.replay(spec, points, rule.aggregation, rule.window_s, start,
                                         now.timestamp(), TICK_S, ratio=definition.is_ratio)
        step = max(1, len(points) // PREVIEW_POINTS)
        chart = [[row[0], _chart_value(row, definition.is_ratio)] for row in points[::step]]
        instances.append({
            "role": role, "process": slot,
            "transitions": [{"at": t.at, "from": t.from_state, "to": t.to_state,
                             "value": t.value} for t in transitions],
            "fired": sum(1 for t in transitions if t.to_state == AlertState.FIRING),
            "points": chart,
        })
    return {"series": definition.name, "unit": definition.unit, "threshold": rule.threshold,
            "from": start, "to": now.timestamp(), "snapshots": len(frames),
            "instances": instances}


def _chart_value(row: tuple[float, ...], ratio: bool) -> float | None:
    if not ratio:
        return row[1]
    return row[1] / row[2] if row[2] else None
