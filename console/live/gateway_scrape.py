"""What the gateway's /metrics say of each deployment: requests it answered and shed per second
and requests waiting in its queues, for the deployment's snapshot (beside its router's numbers).

The gateway is a process of no deployment, so its counters are split here by their
``deployment`` label. Rates are deltas between two scrapes of one gateway process: a new pid
(a restart) starts its counters again. With several replicas each is scraped on its own and
their numbers are added.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ANSWERED = "pdserve_gateway_requests_total"
SHED = "pdserve_gateway_shed_total"
WAITING = "pdserve_gateway_queue_waiting"


@dataclass(frozen=True)
class GatewayScrape:
    pid: int
    at: float  # monotonic seconds
    answered: dict[str, float] = field(default_factory=dict)  # deployment -> count
    shed: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)


def parse(text: str, pid: int, at: float) -> GatewayScrape:
    """Totals by deployment; raises ValueError on text that is not Prometheus' format."""
    totals: dict[str, dict[str, float]] = {ANSWERED: defaultdict(float), SHED: defaultdict(float),
                                           WAITING: defaultdict(float)}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_deployment = totals.get(sample.name)
            deployment = sample.labels.get("deployment")
            if by_deployment is not None and deployment:
                by_deployment[deployment] += sample.value
    return GatewayScrape(pid, at, dict(totals[ANSWERED]), dict(totals[SHED]), dict(totals[WAITING]))


def deployment_stats(previous: GatewayScrape | None, current: GatewayScrape
                     ) -> dict[str, dict[str, float | None]]:
    """Per deployment the gateway knows: ``gateway_rps`` (answered, shed included),
    ``gateway_shed_ps`` and ``gateway_waiting``; the rates None on a first scrape."""
    comparable = previous is not None and previous.pid == current.pid and current.at > previous.at
    names = set(current.answered) | set(current.shed) | set(current.waiting)
    stats: dict[str, dict[str, float | None]] = {}
    for name in names:
        entry: dict[str, float | None] = {"gateway_waiting": current.waiting.get(name, 0.0),
                                          "gateway_rps": None, "gateway_shed_ps": None}
        if comparable:
            assert previous is not None
            elapsed = current.at - previous.at
            entry["gateway_rps"] = _rate(previous.answered, current.answered, name, elapsed)
            entry["gateway_shed_ps"] = _rate(previous.shed, current.shed, name, elapsed)
        stats[name] = entry
    return stats


def summed(replicas: list[dict[str, dict[str, float | None]]]
           ) -> dict[str, dict[str, float | None]]:
    """The replicas' stats added per deployment. A rate is the sum of those known: a replica
    scraped for the first time (just started) adds nothing for one round; None when no replica
    knows it yet."""
    out: dict[str, dict[str, float | None]] = {}
    for stats in replicas:
        for name, entry in stats.items():
            total = out.setdefault(name, {"gateway_waiting": 0.0, "gateway_rps": None,
                                          "gateway_shed_ps": None})
            for field_name, value in entry.items():
                if value is not None:
                    total[field_name] = round((total[field_name] or 0.0) + value, 4)
    return out


def _rate(before: dict[str, float], now: dict[str, float], name: str, elapsed: float) -> float:
    # A label set seen for the first time counted from zero.
    return round(max(0.0, now.get(name, 0.0) - before.get(name, 0.0)) / elapsed, 4)
