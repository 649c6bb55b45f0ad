"""The router's metrics, built from the METRICS table: the names, kinds and labels it had before the
table (the console's collector reads them), with the ``revision`` label of revision groups (the
console sums over labels it does not read), each held by the RouterMetrics attribute declared with
the same kind."""

from __future__ import annotations

from typing import get_type_hints

from prometheus_client import Counter, Gauge, Histogram, generate_latest

from inference.router.metrics import (
    ADDED_BUCKETS,
    LATENCY_BUCKETS,
    METRICS,
    TOKEN_BUCKETS,
    RouterMetrics,
)

# Written down from RouterMetrics.create as it was before the table: (attribute, kind, name, labels);
# then the revision label and the per-token latencies of revision groups, then images.
EXPECTED = [
    ("requests", Counter, "pdserve_router_requests", ("endpoint", "status", "role", "revision")),
    ("added_seconds", Histogram, "pdserve_router_added_seconds", ()),
    ("kv_handoff_seconds", Histogram, "pdserve_router_kv_handoff_seconds", ("revision",)),
    ("auth_failures", Counter, "pdserve_router_auth_failures", ("reason",)),
    ("rate_limited", Counter, "pdserve_router_rate_limited", ("limit",)),
    ("budget_refusals", Counter, "pdserve_router_budget_refusals", ("scope", "period")),
    ("rate_limit_store_errors", Counter, "pdserve_router_rate_limit_store_errors", ()),
    ("key_requests", Counter, "pdserve_router_key_requests", ("key",)),
    ("usage_requests", Counter, "pdserve_router_usage_requests", ("key", "outcome")),
    ("usage_tokens", Counter, "pdserve_router_usage_tokens", ("key", "kind")),
    ("prefill_seconds", Histogram, "pdserve_router_prefill_seconds", ("revision",)),
    ("first_byte_seconds", Histogram, "pdserve_router_first_byte_seconds", ("endpoint", "revision")),
    ("in_flight", Gauge, "pdserve_router_in_flight", ("role", "backend", "revision")),
    ("backend_up", Gauge, "pdserve_router_backend_up", ("role", "backend", "revision")),
    ("pd_fallback", Counter, "pdserve_router_pd_fallback", ("reason", "revision")),
    ("degraded", Counter, "pdserve_router_degraded", ("missing_role", "revision")),
    ("backend_errors", Counter, "pdserve_router_backend_errors", ("role", "kind", "revision")),
    ("handoff_failures", Counter, "pdserve_router_handoff_failures", ("revision",)),
    ("client_disconnects", Counter, "pdserve_router_client_disconnects", ("endpoint",)),
    ("kv_handoffs", Counter, "pdserve_router_kv_handoffs",
     ("prefill", "decode", "outcome", "revision")),
    ("local_prefill", Counter, "pdserve_router_local_prefill", ()),
    ("policy_decisions", Counter, "pdserve_router_policy_decisions", ("role", "policy", "outcome")),
    ("retries", Counter, "pdserve_router_retries", ("role",)),
    ("breaker_opened", Counter, "pdserve_router_breaker_opened", ("role", "backend")),
    ("placements", Counter, "pdserve_router_pd_placements", ("placement", "reason")),
    ("prefill_queue_depth", Gauge, "pdserve_router_prefill_queue_depth", ("revision",)),
    ("prefill_queue_wait_seconds", Histogram, "pdserve_router_prefill_queue_wait_seconds", ()),
    ("adaptive_local_max_tokens", Gauge, "pdserve_router_adaptive_local_max_tokens", ("revision",)),
    ("prefill_speed", Gauge, "pdserve_router_prefill_tokens_per_second", ("where", "revision")),
    ("prefill_tokens_in_flight", Gauge, "pdserve_router_prefill_tokens_in_flight", ("revision",)),
    ("prefill_busy_fraction", Gauge, "pdserve_router_prefill_busy_fraction", ("revision",)),
    ("ttft_seconds", Histogram, "pdserve_router_ttft_seconds", ("revision",)),
    ("itl_seconds", Histogram, "pdserve_router_itl_seconds", ("revision",)),
    ("tpot_seconds", Histogram, "pdserve_router_tpot_seconds", ("revision",)),
    ("migrations", Counter, "pdserve_router_migrations", ("reason", "role", "revision")),
    ("migrations_refused", Counter, "pdserve_router_migrations_refused", ("reason", "revision")),
    # Image parts of chat requests (media.py).
    ("images", Counter, "pdserve_router_images", ()),
    ("image_refusals", Counter, "pdserve_router_image_refusals", ("reason",)),
]
PROMETHEUS_TYPES = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}


def test_the_table_holds_the_metrics_the_router_always_had() -> None:
    assert [(spec.attribute, spec.kind, spec.name, spec.labels) for spec in METRICS] == EXPECTED
    assert all(spec.help for spec in METRICS)


def test_every_metric_is_registered_under_its_name() -> None:
    metrics = RouterMetrics.create()
    families = {family.name: family.type for family in metrics.registry.collect()}
    assert families == {name: PROMETHEUS_TYPES[kind] for _, kind, name, _ in EXPECTED}


def test_each_attribute_is_declared_with_the_kind_its_row_builds() -> None:
    hints = get_type_hints(RouterMetrics)
    assert set(hints) - {"registry"} == {spec.attribute for spec in METRICS}
    metrics = RouterMetrics.create()
    for spec in METRICS:
        assert hints[spec.attribute] is spec.kind
        assert isinstance(getattr(metrics, spec.attribute), spec.kind)


def test_a_label_set_keeps_its_child_until_it_is_removed() -> None:
    metrics = RouterMetrics.create()
    child = metrics.requests.labels("chat", "200", "decode", "1")
    assert metrics.requests.labels("chat", "200", "decode", "1") is child
    assert metrics.requests.labels(endpoint="chat", status="200", role="decode",
                                   revision="1") is child
    gauge = metrics.in_flight.labels("decode", "http://w", "1")
    gauge.set(3)
    metrics.forget_backend("decode", "http://w", "1")
    metrics.in_flight.labels("decode", "http://w", "1").set(1)
    scraped = generate_latest(metrics.registry).decode()
    assert 'pdserve_router_in_flight{backend="http://w",revision="1",role="decode"} 1.0' in scraped


def test_the_histograms_keep_their_buckets() -> None:
    buckets = {spec.attribute: spec.buckets for spec in METRICS if spec.kind is Histogram}
    assert buckets == {"added_seconds": ADDED_BUCKETS, "kv_handoff_seconds": LATENCY_BUCKETS,
                       "prefill_seconds": LATENCY_BUCKETS, "first_byte_seconds": LATENCY_BUCKETS,
                       "prefill_queue_wait_seconds": LATENCY_BUCKETS, "ttft_seconds": TOKEN_BUCKETS,
                       "itl_seconds": TOKEN_BUCKETS, "tpot_seconds": TOKEN_BUCKETS}
    metrics = RouterMetrics.create()
    metrics.added_seconds.observe(0.0003)
    bucket = "pdserve_router_added_seconds_bucket"
    assert metrics.registry.get_sample_value(bucket, {"le": "0.00025"}) == 0
    assert metrics.registry.get_sample_value(bucket, {"le": "0.0005"}) == 1
