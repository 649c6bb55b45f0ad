"""The prefill half of a PD request: a prefill worker (queued by ``pd_adaptive``, retried once
on another worker) computes the prompt, and its answer becomes the body decode is sent, with the
prompt's token ids and the KV channel's transfer parameters."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from inference.router.adaptive import AdaptivePlacer
from inference.router.backends import Backend, KvLease, NoBackendAvailable, Pool
from inference.router.calls import WorkerCalls
from inference.router.config import RouterConfig
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest
from inference.router.retry import retry_target
from inference.router.timeline import Timeline
from inference.router.upstream import BackendFailure, RequestTimedOut, prompt_token_ids

log = logging.getLogger("pdserve.router")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# What the one-token prefill call leaves out of the client's body: what shapes the answer
# (streaming, logprobs, echo, several sequences) or constrains it (structured outputs), all of
# which apply on decode, where the answer is made. Tools stay: they are part of the prompt.
PREFILL_DROPPED = ("stream_options", "min_tokens", "n", "best_of", "logprobs", "top_logprobs",
                   "echo", "prompt_logprobs", "response_format", "structured_outputs",
                   "guided_json", "guided_regex", "guided_choice", "guided_grammar")
# What vLLM's NixlConnector expects on the prefill request to keep the KV for a remote decode.
NIXL_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class PrefillStage:
    def __init__(self, config: RouterConfig, pool: Pool, calls: WorkerCalls,
                 metrics: RouterMetrics, placer: AdaptivePlacer | None, uses_params: bool):
        self.config = config
        self.pool = pool
        self.calls = calls
        self.metrics = metrics
        self.placer = placer
        self.uses_params = uses_params

    async def run(self, parsed: ParsedRequest,
                  timeline: Timeline) -> tuple[dict[str, Any], KvLease | None]:
        """Run the prompt on a prefill worker. Returns the body to send to decode and the lease
        on the prefill worker's KV that decode is to load (None when decode computes the
        prompt); the caller releases it."""
        body = dict(parsed.body)
        for key in PREFILL_DROPPED:
            body.pop(key, None)
        body.update(stream=False, max_tokens=1, return_token_ids=True)
        if parsed.endpoint == "chat":
            body["max_completion_tokens"] = 1
        if self.uses_params:
            body["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)

        backlog = self.metrics.prefill_tokens_in_flight.labels(self.calls.revision)
        tokens = len(parsed.prompt_token_ids)
        backlog.inc(tokens)
        try:
            data, answered, elapsed = await self._compute(parsed, body, timeline)
        finally:
            backlog.dec(tokens)
        self.metrics.prefill_seconds.labels(self.calls.revision).observe(elapsed)
        timeline.mark("prefill_done")

        prefill_ids = prompt_token_ids(parsed.endpoint, data)
        if self.placer is not None:
            self.placer.remote_speed.observe(
                len(prefill_ids) if prefill_ids is not None else len(parsed.prompt_token_ids),
                elapsed)
        if prefill_ids is not None:
            timeline.prompt_tokens = len(prefill_ids)
        decode_body, hands_off = self._decode_body(parsed, data, prefill_ids, timeline)
        # The worker that computed the prompt holds its KV until decode has pulled it.
        return decode_body, answered.lease_kv() if hands_off else None

    async def _compute(self, parsed: ParsedRequest, body: dict[str, Any], timeline: Timeline
                       ) -> tuple[dict[str, Any], Backend, float]:
        """The prefill call itself (waiting for a slot first under pd_adaptive): the answer, the
        worker that gave it and the seconds it took."""
        if self.placer is None:
            backend = self.calls.pick("prefill", parsed)
        else:
            backend = await self._wait_for_slot(parsed, timeline)
        timeline.prefill = backend.url
        timeline.mark("prefill_dispatched")
        started = time.perf_counter()
        answered = backend
        try:
            data = await self.calls.call_json(backend, PATHS[parsed.endpoint], body, timeline)
        except BackendFailure as failure:
            if not failure.retriable:
                raise
            data, answered = await self._retry(parsed, body, failure, timeline)
        finally:
            if self.placer is not None:
                self.placer.queue.release(backend, self._free_chooser(parsed))
        return data, answered, time.perf_counter() - started

    def _decode_body(self, parsed: ParsedRequest, data: dict[str, Any],
                     prefill_ids: list[int] | None,
                     timeline: Timeline) -> tuple[dict[str, Any], bool]:
        decode_body = dict(parsed.body)
        kv_params = data.get("kv_transfer_params")
        if isinstance(kv_params, dict):
            timeline.kv.update({key: kv_params.get(key) for key in (
                "remote_engine_id", "remote_num_tokens", "remote_prefill_cached_tokens")})
        if prefill_ids is None:
            self.metrics.pd_fallback.labels("no_prompt_token_ids", self.calls.revision).inc()
            return decode_body, False
        if parsed.endpoint == "completions":
            # Token ids in, so decode's prompt is exactly what prefill computed.
            decode_body["prompt"] = prefill_ids
        elif prefill_ids != parsed.prompt_token_ids:
            # Decode renders chat itself; if that would differ from what prefill computed, a
            # KV hand-off would crash decode (longer) or return wrong text (shorter). Decode
            # computes the prompt itself instead, which is slower but correct.
            self.metrics.pd_fallback.labels("token_mismatch", self.calls.revision).inc()
            log.warning("request %s: prefill tokens differ from the router's; decode recomputes",
                        timeline.request_id)
            timeline.kv["fallback"] = "token_mismatch"
            return decode_body, False
        if self.uses_params:
            if not kv_params:
                self.metrics.pd_fallback.labels("no_kv_params", self.calls.revision).inc()
                return decode_body, False
            decode_body["kv_transfer_params"] = kv_params
        return decode_body, True

    def _free_chooser(self, parsed: ParsedRequest
                      ) -> Callable[[Callable[[Backend], bool]], Backend | None]:
        pool = self.pool

        def choose(is_free: Callable[[Backend], bool]) -> Backend | None:
            try:
                choice = pool.pick(parsed.prompt_token_ids if pool.policy.uses_prompt else (),
                                   only=is_free)
            except NoBackendAvailable:
                return None
            self.metrics.decision("prefill", pool.policy.name, choice.outcome)
            return choice.backend

        return choose

    async def _wait_for_slot(self, parsed: ParsedRequest, timeline: Timeline) -> Backend:
        assert self.placer is not None
        pool = self.pool

        def ensure_ready() -> None:
            if not pool.ready():
                raise NoBackendAvailable("prefill", pool.backends)

        tokens = len(parsed.prompt_token_ids)
        timeline.mark("prefill_queued")
        queued = time.perf_counter()
        remaining = self.config.request_timeout_s - timeline.since_arrival()
        try:
            backend = await asyncio.wait_for(
                self.placer.queue.acquire(tokens, self.placer.service_s(tokens),
                                          self._free_chooser(parsed), ensure_ready),
                max(remaining, 0.001))
        except TimeoutError:
            raise RequestTimedOut() from None
        self.metrics.prefill_queue_wait_seconds.observe(time.perf_counter() - queued)
        return backend

    async def _retry(self, parsed: ParsedRequest, body: dict[str, Any],
                     failure: BackendFailure,
                     timeline: Timeline) -> tuple[dict[str, Any], Backend]:
        """Once, where retry.py says; the answer and the worker that gave it.
        Safe: the client has received nothing yet, and a one-token prefill has no effect a
        second run could repeat."""
        first = failure.backend
        backend = retry_target(self.pool, parsed, failure, [first], self.metrics)
        if backend is None:
            raise BackendFailure("prefill", first,
                                 f"{failure.detail}; no other ready prefill worker to retry on"
                                 ) from failure
        self.metrics.retries.labels("prefill").inc()
        log.warning("request %s: prefill worker %s failed (%s); retrying on %s",
                    timeline.request_id, first.url, failure.detail, backend.url)
        timeline.retried_from = first.url
        timeline.prefill = backend.url
        timeline.mark("prefill_retried")
        try:
            return await self.calls.call_json(backend, PATHS[parsed.endpoint], body, timeline), backend
        except BackendFailure as second:
            raise BackendFailure(
                "prefill", backend,
                f"{second.detail} (retried after prefill worker {first.url} failed: {failure.detail})",
            ) from second
