"""The console's own /metrics: every process's last scrape, labelled with where it came from.

Users point one Prometheus job at the console instead of at each worker's port, which changes
with every plan. Every sample gets ``deployment`` and ``process`` labels; a label of the same
name already on a sample is kept as ``exported_<name>``, as Prometheus does when it scrapes.
Each reader gets the deployments of their teams (``deployments``; None: all, a superuser's).
Later apps add families of their own (alerts: its facts, for its Prometheus rule file) through
``register_provider``: live may not import them. Scrapes are read by inference/prom_text.py, the
one reader of the text format (the snapshots and the rollout analysis use it too).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from console.live.models import MetricSample, ProcessScrape
from inference import prom_text

# Older scrapes belong to processes that stopped (or to a collector that did): re-exporting
# their frozen counters would show them as alive.
FRESH = timedelta(seconds=30)

# (now, the reader's deployments or None for all) -> families for the page.
FamilyProvider = Callable[[datetime, Collection[int] | None], Iterable[Metric]]
PROVIDERS: list[FamilyProvider] = []


def register_provider(provider: FamilyProvider) -> None:
    if provider not in PROVIDERS:
        PROVIDERS.append(provider)


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _relabelled(sample: Sample, extra: dict[str, str]) -> Sample:
    labels = {(f"exported_{key}" if key in extra else key): value for key, value in sample.labels.items()}
    return sample._replace(labels={**labels, **extra})


def scraped_families(now: datetime, deployments: Collection[int] | None = None) -> list[Metric]:
    """The fresh scrapes of the deployments' processes, merged family by family (a family
    appears once)."""
    families: dict[str, Metric] = {}
    # Requested processes (no deployment) are not scraped; a row of one would have no label.
    scrapes = ProcessScrape.objects.filter(scraped__gte=now - FRESH, process__deployment__isnull=False)
    if deployments is not None:
        scrapes = scrapes.filter(process__deployment__in=deployments)
    scrapes = (scrapes.select_related("process__deployment").order_by("process__deployment__name",
                                                                "process__slot"))
    for scrape in scrapes:
        extra = {"deployment": scrape.process.deployment.name, "process": scrape.process.slot}
        for family in prom_text.families(scrape.text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation,
                                                             family.type, family.unit))
            merged.samples.extend(_relabelled(sample, extra) for sample in family.samples)
    return list(families.values())


def latest_samples(now: datetime, deployments: Collection[int] | None = None) -> list[MetricSample]:
    """Each deployment's latest fresh 1 s sample, by deployment name."""
    latest: dict[int, MetricSample] = {}
    recent = (MetricSample.objects.filter(resolution=MetricSample.Resolution.SECOND,
                                          created__gte=now - FRESH)
              .select_related("deployment").order_by("created"))
    if deployments is not None:
        recent = recent.filter(deployment__in=deployments)
    for sample in recent:
        latest[sample.deployment_id] = sample
    return sorted(latest.values(), key=lambda s: s.deployment.name)


def resource_families(now: datetime, deployments: Collection[int] | None = None) -> list[Metric]:
    """CPU and RSS of every process tree, from each deployment's latest 1 s sample."""
    cpu = GaugeMetricFamily("pdserve_process_cpu_percent",
                            "CPU of the process and its descendants, in % of one core",
                            labels=["deployment", "process", "role"])
    rss = GaugeMetricFamily("pdserve_process_rss_bytes",
                            "Resident memory of the process and its descendants",
                            labels=["deployment", "process", "role"])
    for sample in latest_samples(now, deployments):
        for slot, process in sorted(sample.data.get("processes", {}).items()):
            labels = [sample.deployment.name, slot, process.get("role", "")]
            if process.get("cpu") is not None:
                cpu.add_metric(labels, process["cpu"])
            if process.get("rss") is not None:
                rss.add_metric(labels, process["rss"])
    return [cpu, rss]


def render(now: datetime, deployments: Collection[int] | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    provided = [family for provider in PROVIDERS for family in provider(now, deployments)]
    registry.register(_Families(scraped_families(now, deployments)
                                + resource_families(now, deployments) + provided))
    return generate_latest(registry)
