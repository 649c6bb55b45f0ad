"""The gateway's Prometheus metrics, on a registry owned by the app (no globals).

Every ``model`` label is a served model name or alias of the configuration, or "" for a model
the configuration does not know: a client cannot grow the label set with names of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inference.gateway.flow_control import FlowControl

# Up to the whole answer of a non-streamed request: a router sends its headers once generation
# is done, which may take minutes.
UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                    120, 300)
QUEUE_BUCKETS = (0.0, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    fallbacks: Counter
    auth_failures: Counter
    upstream_seconds: Histogram
    config_info: Gauge
    shed: Counter
    queue_seconds: Histogram

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter(
                "pdserve_gateway_requests",
                "Inference requests answered, by model, the deployment that answered (\"\" when "
                "none did) and HTTP status", ("model", "deployment", "status"), registry=registry),
            fallbacks=Counter(
                "pdserve_gateway_fallbacks",
                "Requests passed on to a model's next deployment because one had no router, could "
                "not be reached or answered 502/503/504", ("model", "from_deployment", "to_deployment"),
                registry=registry),
            auth_failures=Counter(
                "pdserve_gateway_auth_failures",
                "Requests refused with 401, by reason (missing, invalid, revoked)", ("reason",),
                registry=registry),
            upstream_seconds=Histogram(
                "pdserve_gateway_upstream_seconds",
                "From sending a request to a deployment's router to its response headers",
                ("model",), buckets=UPSTREAM_BUCKETS, registry=registry),
            config_info=Gauge(
                "pdserve_gateway_config_info",
                "1, labelled with the version of the configuration the gateway serves with",
                ("version",), registry=registry),
            shed=Counter(
                "pdserve_gateway_shed",
                "Requests the gateway's queue of a saturated deployment refused, by priority band "
                "and why: queue_full (429, the newcomer shed), shed (429, displaced by a higher "
                "band), queue_timeout (503, waited too long)", ("deployment", "band", "reason"),
                registry=registry),
            queue_seconds=Histogram(
                "pdserve_gateway_queue_wait_seconds",
                "Time a request waited in the gateway's queue of its deployment before it was "
                "sent on (0 when the deployment was not saturated)", ("deployment", "band"),
                buckets=QUEUE_BUCKETS, registry=registry),
        )

    def answered(self, model: str, deployment: str, status: int) -> None:
        self.requests.labels(model, deployment, str(status)).inc()

    def config_applied(self, version: str) -> None:
        # One series only: the version served now.
        self.config_info.clear()
        self.config_info.labels(version).set(1)


class QueueCollector(Collector):
    """The queues' depth and in-flight counts, read when Prometheus scrapes rather than kept up
    to date on every request.

    The ``flow`` label is a key's team (or ``key-<id>``), or what a key allowed to set
    X-Pdserve-Fairness-Id sends: give that right only to keys whose flows stay few.
    """

    def __init__(self, flows: FlowControl):
        self.flows = flows

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily("pdserve_gateway_queue_waiting",
                                    "Requests waiting in the gateway's queue of a saturated "
                                    "deployment, by priority band and fairness flow",
                                    labels=("deployment", "band", "flow"))
        in_flight = GaugeMetricFamily("pdserve_gateway_in_flight",
                                      "Requests the gateway has in flight to a queued deployment",
                                      labels=("deployment",))
        limit = GaugeMetricFamily("pdserve_gateway_concurrency_limit",
                                  "Requests in flight past which the gateway queues a deployment's "
                                  "requests", labels=("deployment",))
        for name, queue in list(self.flows.queues.items()):
            stats = queue.stats()
            in_flight.add_metric((name,), stats.in_flight)
            limit.add_metric((name,), stats.limit)
            for (band, flow), count in stats.waiting.items():
                waiting.add_metric((name, band, flow), count)
        yield from (waiting, in_flight, limit)
