"""The gateway's Prometheus metrics, on a registry owned by the app (no globals).

Every ``model`` label is a served model name or alias of the configuration, or "" for a model
the configuration does not know: a client cannot grow the label set with names of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Up to the whole answer of a non-streamed request: a router sends its headers once generation
# is done, which may take minutes.
UPSTREAM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                    120, 300)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    fallbacks: Counter
    auth_failures: Counter
    upstream_seconds: Histogram
    config_info: Gauge

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
        )

    def answered(self, model: str, deployment: str, status: int) -> None:
        self.requests.labels(model, deployment, str(status)).inc()

    def config_applied(self, version: str) -> None:
        # One series only: the version served now.
        self.config_info.clear()
        self.config_info.labels(version).set(1)
