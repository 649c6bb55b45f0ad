"""The worker call whose answer goes to the client: a decode (or colocated, or a whole-request
prefill) worker's answer relayed as it comes, streamed chunk by chunk or in one piece, with a
failed KV hand-off and a mid-stream failure each told to the client as what they are."""

from __future__ import annotations

import contextlib
import logging
import time

import aiohttp
from aiohttp import web

from inference.router.adaptive import AdaptivePlacer
from inference.router.backends import Backend, KvLease
from inference.router.calls import WorkerCalls
from inference.router.handoff import PATHS
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest
from inference.router.timeline import Timeline
from inference.router.upstream import (
    BackendFailure,
    describe,
    error_response,
    relay,
    sse_error,
    stream_usage_counts,
    upstream_message,
    usage_counts,
)

log = logging.getLogger("pdserve.router")

# Names the revision group that served the request (see groups.py), on every answer.
REVISION_HEADER = "X-Pdserve-Revision"


class Forwarder:
    def __init__(self, calls: WorkerCalls, metrics: RouterMetrics, placer: AdaptivePlacer | None):
        self.calls = calls
        self.metrics = metrics
        self.placer = placer

    async def forward(self, request: web.Request, role: str, parsed: ParsedRequest,
                      body: bytes, timeline: Timeline,
                      handoff: KvLease | None = None) -> web.StreamResponse:
        """Send ``body`` (JSON) to one worker of ``role`` and relay its answer, streamed or not.
        ``handoff``: the prefill worker's KV that decode must load; released once decode has
        started answering (the caller releases it on every other way out)."""
        backend = self.calls.pick(role, parsed)
        try:
            return await self._call(request, role, parsed, backend, body, timeline, handoff)
        except BackendFailure as failure:
            if not failure.unsent:
                raise
            first = failure
        again = self.calls.pick_again(role, parsed, first)
        if again is None:
            raise first
        self.metrics.retries.labels(role).inc()
        log.warning("request %s: %s; retrying on %s", timeline.request_id, first, again.url)
        timeline.retried_from = backend.url
        timeline.mark(f"{role}_retried")
        return await self._call(request, role, parsed, again, body, timeline, handoff)

    async def _call(self, request: web.Request, role: str, parsed: ParsedRequest,
                    backend: Backend, body: bytes, timeline: Timeline,
                    handoff: KvLease | None) -> web.StreamResponse:
        request_id = timeline.request_id
        if role == "decode":
            timeline.decode = backend.url
        elif role == "prefill":
            timeline.prefill = backend.url
        # The first dispatch: a retry is marked as such after it.
        timeline.mark_once("decode_dispatched")
        # Not retriable: a failure here may come after chunks reached the client.
        async with self.calls.post(
            backend, PATHS[parsed.endpoint], timeline, retriable=False, data=body,
            headers={"X-Request-Id": request_id, "Content-Type": "application/json"},
        ) as upstream:
            if upstream.status != 200 or not parsed.stream:
                payload = await upstream.read()
                if handoff is not None:
                    handoff.release()
                if upstream.status >= 500 and handoff is not None:
                    return self._handoff_failed(backend, handoff.backend.url, upstream.status,
                                                payload, timeline)
                if upstream.status >= 500:
                    self.calls.call_failed(backend)
                elif upstream.status == 200:
                    backend.call_succeeded()
                self.metrics.first_byte_seconds.labels(parsed.endpoint, self.calls.revision).observe(
                    timeline.since_arrival())
                timeline.mark("first_token")
                timeline.mark("last_token")
                if upstream.status == 200:
                    timeline.prompt_tokens, timeline.completion_tokens = usage_counts(payload)
                return relay(upstream.status, payload, upstream, request_id)
            return await self._stream(request, role, parsed, backend, upstream, timeline, handoff)

    async def _stream(self, request: web.Request, role: str, parsed: ParsedRequest,
                      backend: Backend, upstream: aiohttp.ClientResponse,
                      timeline: Timeline, handoff: KvLease | None) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": timeline.request_id,
            REVISION_HEADER: self.calls.revision,
        })
        await response.prepare(request)
        timeline.streamed = True
        first = True
        itl = self.metrics.itl_seconds.labels(self.calls.revision)
        sent_at = 0.0
        # The last two chunks: where the usage event a client may ask for ends the stream.
        previous = last = b""
        try:
            # hot path: runs once per streamed chunk
            async for chunk in upstream.content.iter_any():
                if handoff is not None:
                    # Decode has produced a token, so it has pulled the KV.
                    handoff.release()
                try:
                    await response.write(chunk)
                except ConnectionResetError:
                    # The client left. Leaving the caller's block closes the connection to the
                    # worker, and vLLM aborts a request whose client is gone.
                    self.metrics.client_disconnects.labels(parsed.endpoint).inc()
                    timeline.error = "client disconnected"
                    return response
                timeline.stream_chunks += chunk.count(b"data: ")
                previous, last = last, chunk
                # Inter-token latency between JSON events ([DONE] is none); events that came
                # in one read reach the client together, as the benchmark client sees them.
                if tokens := chunk.count(b"data: {"):
                    now = time.perf_counter()
                    if sent_at:
                        itl.observe(now - sent_at)
                    for _ in range(tokens - 1):
                        itl.observe(0.0)
                    sent_at = now
                if first:
                    first = False
                    self.metrics.first_byte_seconds.labels(parsed.endpoint, self.calls.revision
                                                           ).observe(timeline.since_arrival())
                    timeline.mark("first_token")
                    if (self.placer is not None and timeline.kv.get("local_prefill")
                            and timeline.retried_from is None):
                        # The prompt's prefill on decode, plus the wait for the worker's step
                        # in progress: what its streams paused for.
                        self.placer.local_speed.observe(
                            len(parsed.prompt_token_ids),
                            (timeline.events["first_token"]
                             - timeline.events["decode_dispatched"]) / 1000)
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            self.calls.backend_failed(backend, exc)
            timeline.error = f"{role} failed mid-stream: {describe(exc)}"
            with contextlib.suppress(ConnectionResetError):
                await response.write(sse_error(role, backend, exc))
        else:
            backend.call_succeeded()
            tail = previous + last
            if b'"usage"' in tail:
                prompt_tokens, completion_tokens = stream_usage_counts(tail)
                if completion_tokens is not None:
                    timeline.prompt_tokens, timeline.completion_tokens = (prompt_tokens,
                                                                          completion_tokens)
        timeline.mark("last_token")
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    def _handoff_failed(self, backend: Backend, prefill_url: str, status: int, payload: bytes,
                        timeline: Timeline) -> web.Response:
        # vLLM answers 500 (after its ~5 s KV load timeout) when decode cannot load the blocks
        # prefill announced: stale or expired transfer params, a prefill that died meanwhile.
        # Its message alone reads like a decode bug; say which hand-off failed.
        message = (f"KV hand-off failed: decode worker {backend.url} could not use the KV cache "
                   f"prefilled by {prefill_url} (decode answered {status}: "
                   f"{upstream_message(payload)})")
        self.metrics.backend_errors.labels("decode", "kv_handoff", self.calls.revision).inc()
        self.metrics.handoff_failures.labels(self.calls.revision).inc()
        timeline.error = message
        return error_response(502, message, timeline.request_id, code="kv_handoff_failed")
