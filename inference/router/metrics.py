"""The router's Prometheus metrics, registered on a registry owned by the app (no globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inference.router.ratelimit import generated_estimate
from inference.router.timeline import CLIENT_GONE, Timeline

ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Per-token latencies, compared between two revisions from the difference of two scrapes: at
# most 1.5x between bounds over 0.01-10 s, so an interpolated p95 is off by less than that step.
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
                 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 4, 5, 7.5, 10, 15, 30, 60)


class _KeptChildren:
    """labels() that keeps each label set's child: prometheus_client's own checks its
    arguments, converts them to strings and takes a lock on every call, and the router calls it
    several times per request (hot path)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._kept: dict[tuple[object, ...], Self] = {}

    def labels(self, *values: object, **named: object) -> Self:
        if named:
            return super().labels(*values, **named)  # type: ignore[misc]
        child = self._kept.get(values)
        if child is None:
            child = self._kept[values] = super().labels(*values)  # type: ignore[misc]
        return child

    # A removed child must not be handed out again: it would count where no scrape sees.
    def remove(self, *values: object) -> None:
        self._kept.clear()
        super().remove(*values)  # type: ignore[misc]

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        self._kept.clear()
        super().remove_by_labels(labels)  # type: ignore[misc]

    def clear(self) -> None:
        self._kept.clear()
        super().clear()  # type: ignore[misc]


class KeptCounter(_KeptChildren, Counter):
    pass


class KeptGauge(_KeptChildren, Gauge):
    pass


class KeptHistogram(_KeptChildren, Histogram):
    pass


KEPT = {Counter: KeptCounter, Gauge: KeptGauge, Histogram: KeptHistogram}


@dataclass(frozen=True)
class MetricSpec:
    """One row of METRICS: a RouterMetrics attribute and the metric it holds."""

    attribute: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # histograms only

    def build(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        kind = KEPT[self.kind] if self.labels else self.kind
        if self.kind is Histogram:
            return kind(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)
        return kind(self.name, self.help, self.labels, registry=registry)


# The console's collector and the dashboards read these names and labels: change them deliberately.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("requests", Counter, "pdserve_router_requests",
               "Requests answered, by endpoint, HTTP status and the workers that served them "
               "(prefill+decode, decode, prefill, colocated, or none when refused first)",
               ("endpoint", "status", "role", "revision")),
    MetricSpec("added_seconds", Histogram, "pdserve_router_added_seconds",
               "The router's own time before a request's first token: before its first call to a "
               "worker, and between prefill's answer and the call to decode (queue waits excluded)",
               buckets=ADDED_BUCKETS),
    MetricSpec("kv_handoff_seconds", Histogram, "pdserve_router_kv_handoff_seconds",
               "From prefill's answer to decode's first token: the KV load plus decode's first step",
               ("revision",), buckets=LATENCY_BUCKETS),
    MetricSpec("auth_failures", Counter, "pdserve_router_auth_failures",
               "Requests refused with 401, by reason (missing, invalid, revoked, out_of_scope)",
               ("reason",)),
    MetricSpec("rate_limited", Counter, "pdserve_router_rate_limited",
               "Requests refused with 429, by the key's limit they exceeded", ("limit",)),
    MetricSpec("budget_refusals", Counter, "pdserve_router_budget_refusals",
               "Requests refused with 429 because a token budget is spent, by whose (key, team) "
               "and period (day, month)", ("scope", "period")),
    MetricSpec("rate_limit_store_errors", Counter, "pdserve_router_rate_limit_store_errors",
               "Failed calls to the Redis that holds the rate-limit counters; the router counts "
               "in its own memory meanwhile"),
    MetricSpec("key_requests", Counter, "pdserve_router_key_requests",
               "Requests admitted per API key, labelled by the key's public prefix", ("key",)),
    # The same requests as the usage ledger (usage.py) counts, for dashboards; the ledger is what
    # survives a restart. Labelled by keys only, so the label sets stay as few as the keys.
    MetricSpec("usage_requests", Counter, "pdserve_router_usage_requests",
               "Requests metered for usage once their body was parsed, by API key (its public "
               "prefix; empty without a key) and outcome: error (answered >= 400, or a stream "
               "that ended with an error event, broke off or lost its client) or ok",
               ("key", "outcome")),
    MetricSpec("usage_tokens", Counter, "pdserve_router_usage_tokens",
               "Tokens metered for usage, by API key (its public prefix; empty without a key) and "
               "kind (prompt, completion); a prompt whose count the router never learned counts 0",
               ("key", "kind")),
    MetricSpec("prefill_seconds", Histogram, "pdserve_router_prefill_seconds",
               "Time from dispatch to the prefill worker until its answer (the KV hand-off point)",
               ("revision",), buckets=LATENCY_BUCKETS),
    MetricSpec("first_byte_seconds", Histogram, "pdserve_router_first_byte_seconds",
               "Time from request arrival to the first response byte sent to the client",
               ("endpoint", "revision"), buckets=LATENCY_BUCKETS),
    MetricSpec("in_flight", Gauge, "pdserve_router_in_flight", "Requests in flight per backend",
               ("role", "backend", "revision")),
    MetricSpec("backend_up", Gauge, "pdserve_router_backend_up",
               "1 when the backend passes its health probe", ("role", "backend", "revision")),
    MetricSpec("pd_fallback", Counter, "pdserve_router_pd_fallback",
               "Requests decoded without prefilled KV, by reason", ("reason", "revision")),
    MetricSpec("degraded", Counter, "pdserve_router_degraded",
               "Requests served in degraded mode because no worker of one role was ready: its "
               "prompt prefilled on decode (missing_role=prefill), or the whole request run on "
               "prefill (missing_role=decode)", ("missing_role", "revision")),
    MetricSpec("backend_errors", Counter, "pdserve_router_backend_errors",
               "Failed calls to a backend, by role and kind (kind=kv_handoff: decode could not "
               "load the KV prefill announced)", ("role", "kind", "revision")),
    MetricSpec("handoff_failures", Counter, "pdserve_router_handoff_failures",
               "KV hand-offs that failed: decode could not load the KV prefill announced (the "
               "client got 502 kv_handoff_failed); with the count of kv_handoff_seconds, the "
               "hand-offs tried", ("revision",)),
    MetricSpec("client_disconnects", Counter, "pdserve_router_client_disconnects",
               "Streams the client closed before the end; the worker request is aborted",
               ("endpoint",)),
    MetricSpec("kv_handoffs", Counter, "pdserve_router_kv_handoffs",
               "Requests prefilled on one worker and decoded on another, by pair and outcome "
               "(ok, failed, abandoned: the client left first)",
               ("prefill", "decode", "outcome", "revision")),
    MetricSpec("local_prefill", Counter, "pdserve_router_local_prefill",
               "Short prompts sent straight to decode, which prefilled them itself"),
    MetricSpec("policy_decisions", Counter, "pdserve_router_policy_decisions",
               "Backends chosen, by role, routing policy and why (e.g. prefix_hit, prefix_miss, "
               "overloaded_fallback, short_prompt; picked for policies without alternatives)",
               ("role", "policy", "outcome")),
    MetricSpec("retries", Counter, "pdserve_router_retries",
               "Requests retried on another backend after a failure before any token, by role",
               ("role",)),
    MetricSpec("breaker_opened", Counter, "pdserve_router_breaker_opened",
               "Times a worker's circuit breaker opened (failed calls in a row)", ("role", "backend")),
    MetricSpec("placements", Counter, "pdserve_router_pd_placements",
               "pd_adaptive: where each request's prompt was prefilled (local on decode, remote "
               "on prefill, or the whole request on an idle prefill worker), and why",
               ("placement", "reason")),
    MetricSpec("prefill_queue_depth", Gauge, "pdserve_router_prefill_queue_depth",
               "pd_adaptive: prompts waiting in the router for a free prefill slot", ("revision",)),
    MetricSpec("prefill_queue_wait_seconds", Histogram, "pdserve_router_prefill_queue_wait_seconds",
               "pd_adaptive: time a prompt waited for a prefill slot", buckets=LATENCY_BUCKETS),
    MetricSpec("adaptive_local_max_tokens", Gauge, "pdserve_router_adaptive_local_max_tokens",
               "pd_adaptive: the longest prompt a decode worker prefills itself now (from the "
               "measured prefill speed and the stall budget)", ("revision",)),
    MetricSpec("prefill_speed", Gauge, "pdserve_router_prefill_tokens_per_second",
               "pd_adaptive: measured prefill speed, on prefill workers (remote) and on decode "
               "workers (local); 0 until measured",
               ("where", "revision")),
    MetricSpec("prefill_tokens_in_flight", Gauge, "pdserve_router_prefill_tokens_in_flight",
               "Prompt tokens sent to prefill (or waiting in the router for a prefill slot) and "
               "not computed yet: the backlog a prefill autoscaler sizes the pool on",
               ("revision",)),
    MetricSpec("prefill_busy_fraction", Gauge, "pdserve_router_prefill_busy_fraction",
               "pd_adaptive: share of the last 30 s during which a remote prefill ran",
               ("revision",)),
    # As vLLM's benchmark client measures them, over streamed answers: a non-streamed answer's
    # first byte is its last (see first_byte_seconds).
    MetricSpec("ttft_seconds", Histogram, "pdserve_router_ttft_seconds",
               "Streamed answers: time from request arrival to the first event sent to the client",
               ("revision",), buckets=TOKEN_BUCKETS),
    MetricSpec("itl_seconds", Histogram, "pdserve_router_itl_seconds",
               "Streamed answers: time between two events sent to the client (events that arrive "
               "together count 0 after the first)", ("revision",), buckets=TOKEN_BUCKETS),
    MetricSpec("tpot_seconds", Histogram, "pdserve_router_tpot_seconds",
               "Streamed answers of more than one token: (end-to-end time - TTFT) / (completion "
               "tokens - 1), per request", ("revision",), buckets=TOKEN_BUCKETS),
    MetricSpec("migrations", Counter, "pdserve_router_migrations",
               "Requests moved to another worker after theirs failed, by reason (not_sent: "
               "never reached it; before_first_byte: failed before the client had a byte, "
               "run again from the start; mid_stream: a stream continued from its last token; "
               "after_last_token: only its ending was lost) and the failed worker's role",
               ("reason", "role", "revision")),
    MetricSpec("migrations_refused", Counter, "pdserve_router_migrations_refused",
               "Streams cut mid-way that could not go on on another worker (they end with an "
               "SSE error event), by why: several_sequences, logprobs, echo, structured_output, "
               "tools, stop_strings, no_token_ids, parsed_output, no_worker, request_timeout, ...",
               ("reason", "revision")),
    MetricSpec("images", Counter, "pdserve_router_images",
               "Image parts of chat requests that passed the image limits (media.py); file and "
               "remote ones were inlined as data URLs"),
    MetricSpec("image_refusals", Counter, "pdserve_router_image_refusals",
               "Chat requests answered 400 for an image part, by reason: no_images (the model "
               "takes none), too_many, too_large, too_many_pixels, bad_data_url, unreadable, "
               "file_refused, remote_refused, fetch_failed, bad_part, unsupported_part (audio, "
               "video, embeddings)", ("reason",)),
)


@dataclass
class RouterMetrics:
    """The metrics of METRICS as typed attributes (a unit test checks each against its row)."""

    registry: CollectorRegistry
    requests: Counter
    added_seconds: Histogram
    kv_handoff_seconds: Histogram
    auth_failures: Counter
    rate_limited: Counter
    budget_refusals: Counter
    rate_limit_store_errors: Counter
    key_requests: Counter
    usage_requests: Counter
    usage_tokens: Counter
    prefill_seconds: Histogram
    first_byte_seconds: Histogram
    in_flight: Gauge
    backend_up: Gauge
    pd_fallback: Counter
    degraded: Counter
    backend_errors: Counter
    handoff_failures: Counter
    client_disconnects: Counter
    kv_handoffs: Counter
    local_prefill: Counter
    policy_decisions: Counter
    retries: Counter
    breaker_opened: Counter
    placements: Counter
    prefill_queue_depth: Gauge
    prefill_queue_wait_seconds: Histogram
    adaptive_local_max_tokens: Gauge
    prefill_speed: Gauge
    prefill_tokens_in_flight: Gauge
    prefill_busy_fraction: Gauge
    ttft_seconds: Histogram
    itl_seconds: Histogram
    tpot_seconds: Histogram
    migrations: Counter
    migrations_refused: Counter
    images: Counter
    image_refusals: Counter

    @classmethod
    def create(cls) -> RouterMetrics:
        registry = CollectorRegistry()
        built: dict[str, Any] = {spec.attribute: spec.build(registry) for spec in METRICS}
        return cls(registry=registry, **built)

    def record_request(self, timeline: Timeline) -> None:
        """Count one answered request from its timeline (once, when it ends)."""
        events = timeline.events
        revision = timeline.revision or ""
        if timeline.prefill and timeline.decode:
            role = "prefill+decode"
        elif timeline.decode:
            role = "decode"
        elif timeline.prefill:
            role = "prefill"
        else:
            # A colocated worker is the only one a dispatch names in neither field.
            role = "colocated" if "decode_dispatched" in events else "none"
        self.requests.labels(timeline.endpoint, str(timeline.status), role, revision).inc()
        if timeline.prefill and timeline.decode:
            outcome = _handoff_outcome(timeline)
            self.kv_handoffs.labels(timeline.prefill, timeline.decode, outcome, revision).inc()
            if outcome == "ok" and "prefill_done" in events and "first_token" in events:
                self.kv_handoff_seconds.labels(revision).observe(
                    (events["first_token"] - events["prefill_done"]) / 1000)
        if timeline.status == 200:
            # The router's own time before the first token: before its first call to a worker
            # (parsing, keys, limits, tokenizing), and between prefill's answer and the call
            # to decode. Time spent waiting in the prefill queue is the workers', not the router's.
            first_call = next((events[e] for e in ("prefill_queued", "prefill_dispatched",
                                                   "decode_dispatched") if e in events), None)
            if first_call is not None:
                added = first_call
                if "prefill_done" in events and "decode_dispatched" in events:
                    added += events["decode_dispatched"] - events["prefill_done"]
                self.added_seconds.observe(added / 1000)
            if timeline.streamed and "first_token" in events and not timeline.error:
                self._token_latencies(timeline, revision)

    def _token_latencies(self, timeline: Timeline, revision: str) -> None:
        """TTFT and TPOT of a streamed answer, as vLLM's benchmark client computes them."""
        ttft_ms = timeline.events["first_token"]
        self.ttft_seconds.labels(revision).observe(ttft_ms / 1000)
        tokens = generated_estimate(timeline.completion_tokens, timeline.stream_chunks,
                                    timeline.endpoint)
        if tokens > 1 and "last_token" in timeline.events:
            self.tpot_seconds.labels(revision).observe(
                (timeline.events["last_token"] - ttft_ms) / 1000 / (tokens - 1))

    def record_usage(self, key: str, failed: bool, prompt_tokens: int,
                     completion_tokens: int) -> None:
        """Count one metered request; ``key``: its key's label, "" without one."""
        self.usage_requests.labels(key, "error" if failed else "ok").inc()
        self.usage_tokens.labels(key, "prompt").inc(prompt_tokens)
        self.usage_tokens.labels(key, "completion").inc(completion_tokens)

    def decision(self, role: str, policy: str, outcome: str) -> None:
        self.policy_decisions.labels(role, policy, outcome).inc()

    def forget_backend(self, role: str, url: str, revision: str) -> None:
        """Drop a removed backend's gauges, so a scrape does not show it forever."""
        self.backend_up.remove(role, url, revision)
        self.in_flight.remove(role, url, revision)

    def forget_group(self, revision: str) -> None:
        """Drop the gauges of a removed group (its backends' and its placer's); its counters
        and histograms stay, so that rates over a window that saw it remain right."""
        for gauge in (self.backend_up, self.in_flight, self.prefill_queue_depth,
                      self.adaptive_local_max_tokens, self.prefill_speed,
                      self.prefill_busy_fraction, self.prefill_tokens_in_flight):
            gauge.remove_by_labels({"revision": revision})


def _handoff_outcome(timeline: Timeline) -> str:
    """``ok``, ``failed``, or ``abandoned``: the client left (499) before the pair was done,
    which says nothing of the hand-off. Counted as failed, every verification's streamed
    checks (their clients close once they have read enough) showed a healthy pair failing."""
    if timeline.status == CLIENT_GONE:
        return "abandoned"
    return "ok" if timeline.status == 200 and not timeline.error else "failed"
