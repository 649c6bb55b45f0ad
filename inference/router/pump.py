"""One worker's stream relayed to the client: its events through the request's StreamRelay
(migration.py), the first-token and inter-token metrics, and the client leaving. forward.py runs
one pump after another when a stream goes on on another worker."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from inference.router.adaptive import AdaptivePlacer
from inference.router.backends import Backend, KvLease
from inference.router.calls import WorkerCalls
from inference.router.metrics import RouterMetrics
from inference.router.migration import StreamRelay
from inference.router.prompts import ParsedRequest
from inference.router.timeline import Timeline

# How vLLM ends a stream it could not finish (before data: [DONE]).
STREAM_ERROR_EVENT = b'data: {"error"'


class Pump:
    """Relays one worker's stream to the client after another: the events (through the
    request's StreamRelay), the first-token and inter-token metrics, and the client leaving."""

    ENDED, CLIENT_GONE, FAILED = object(), object(), object()

    def __init__(self, calls: WorkerCalls, metrics: RouterMetrics, request: web.Request,
                 response: web.StreamResponse, parsed: ParsedRequest, timeline: Timeline,
                 stream: StreamRelay, local_speed_of: AdaptivePlacer | None):
        """``local_speed_of``: the placer whose prefill speed on decode this stream's first
        token measures (decode computed its prompt), if any."""
        self.calls = calls
        self.metrics = metrics
        self.request = request
        self.response = response
        self.parsed = parsed
        self.timeline = timeline
        self.stream = stream
        self.local_speed_of = local_speed_of
        # Unless the stream is continuable, its bytes go on as they come, unparsed.
        self.parsing = stream.blocked is None
        self.itl = metrics.itl_seconds.labels(calls.revision)
        self.sent_at = 0.0
        # The last two chunks: where the usage event a client may ask for ends the stream.
        self.previous = self.last = b""

    async def write(self, data: bytes) -> bool:
        """Pass ``data`` on; False if the client has left."""
        if not self.response.prepared:
            await self.response.prepare(self.request)
            self.timeline.streamed = True
        try:
            await self.response.write(data)
        except ConnectionResetError:
            # The client left. Leaving the caller's block closes the connection to the
            # worker, and vLLM aborts a request whose client is gone.
            self.metrics.client_disconnects.labels(self.parsed.endpoint).inc()
            self.timeline.error = "client disconnected"
            return False
        return True

    async def run(self, upstream: aiohttp.ClientResponse, backend: Backend,
                  handoff: KvLease | None) -> object:
        """Relay ``upstream`` until it ends (ENDED), the client leaves (CLIENT_GONE) or the
        worker fails (the exception; told to passive health once the client has had bytes,
        before that the caller's block does it)."""
        timeline = self.timeline
        try:
            # hot path: runs once per streamed chunk
            async for chunk in upstream.content.iter_any():
                if handoff is not None:
                    # Decode has produced a token, so it has pulled the KV.
                    handoff.release()
                out = self.stream.feed(chunk) if self.parsing else chunk
                if not out:
                    continue
                first = not self.response.prepared
                if not await self.write(out):
                    return self.CLIENT_GONE
                timeline.stream_chunks += out.count(b"data: ")
                self.previous, self.last = self.last, out
                # Inter-token latency between JSON events ([DONE] is none); events that came
                # in one read reach the client together, as the benchmark client sees them.
                if tokens := out.count(b"data: {"):
                    now = time.perf_counter()
                    if self.sent_at:
                        self.itl.observe(now - self.sent_at)
                    for _ in range(tokens - 1):
                        self.itl.observe(0.0)
                    self.sent_at = now
                if first:
                    self._first_token()
        except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            if self.response.prepared:
                self.calls.backend_failed(backend, exc)
            return exc
        if not self.response.prepared:
            # An empty answer: the client still gets its (empty) stream.
            await self.response.prepare(self.request)
            timeline.streamed = True
        elif timeline.error is None and STREAM_ERROR_EVENT in self.previous + self.last:
            # vLLM fails a stream it has begun with an error event and then [DONE]: a 200 that
            # the usage ledger and the timeline must still count as failed.
            timeline.error = "the worker ended the stream with an error event"
        return self.ENDED

    def _first_token(self) -> None:
        timeline, parsed = self.timeline, self.parsed
        self.metrics.first_byte_seconds.labels(parsed.endpoint, self.calls.revision
                                                    ).observe(timeline.since_arrival())
        timeline.mark("first_token")
        if self.local_speed_of is not None:
            # The prompt's prefill on decode, plus the wait for the worker's step in
            # progress: what its streams paused for.
            self.local_speed_of.local_speed.observe(
                len(parsed.prompt_token_ids),
                (timeline.events["first_token"] - timeline.events["decode_dispatched"]) / 1000)
