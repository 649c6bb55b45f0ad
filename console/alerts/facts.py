"""The deployment series no process exports, gathered by the evaluator each tick: planned ports
that a process outside the deployment holds, and metric families a live worker's scrape lacks."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from console.alerts import series as catalog
from console.alerts.models import AlertRule
from console.deployments.models import Deployment
from console.fleet import port_holders
from console.live.models import ProcessScrape
from console.supervisor.models import ManagedProcess


def foreign_ports(deployment: Deployment, processes: dict[str, ManagedProcess],
                   listeners: dict[int, set[int]]) -> tuple[float, str]:
    own: set[int] = set()
    for process in processes.values():
        if process.pid:
            own |= port_holders.process_tree(process.pid)
    planned = [(w.slot, w.port) for w in deployment.workers.all()] + [
        ("router", deployment.router_port)]
    foreign = [f"{slot} port {port} held by "
               + ", ".join(port_holders.describe_process(pid) for pid in sorted(pids))
               for slot, port in planned
               if (pids := listeners.get(port)) and not pids <= own]
    return float(len(foreign)), "; ".join(foreign)


def missing_families(rules: list[AlertRule], processes: dict[str, ManagedProcess],
                      now: datetime) -> tuple[float, str]:
    """Metric families the deployment's rules need that a live process's last scrape lacks:
    what a renamed engine metric looks like before it silently matches nothing."""
    needed: dict[str, set[str]] = {}
    for rule in rules:
        try:
            definition = catalog.get(rule.series)
        except ValueError:
            continue
        for role in definition.roles:
            if not rule.role or rule.role == role:
                needed.setdefault(role, set()).update(definition.sources)
    fresh = now - timedelta(seconds=30)
    ready = {p.pk: p for p in processes.values() if p.state == ManagedProcess.State.READY}
    missing = []
    for scrape in ProcessScrape.objects.filter(process_id__in=list(ready), scraped__gte=fresh):
        process = ready[scrape.process_id]
        present = _families(scrape.text)
        lacking = sorted(name for name in needed.get(process.role, ()) if name not in present)
        missing += [f"{name} on {process.slot}" for name in lacking]
    return float(len(missing)), ", ".join(missing)


_SAMPLE_NAME = re.compile(r"^(?:# TYPE )?([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def _families(text: str) -> set[str]:
    """The metric names a scrape declares or has samples of: a labelled family without samples
    yet (no request so far) is declared by its TYPE line, which counts as present. Histogram and
    summary suffixes also name the family, and a counter's family answers with and without
    ``_total``."""
    names = set(_SAMPLE_NAME.findall(text))
    for name in list(names):
        for suffix in ("_bucket", "_count", "_sum", "_created"):
            if name.endswith(suffix):
                names.add(name[: -len(suffix)])
        names.add(name[:-6] if name.endswith("_total") else f"{name}_total")
    return names
