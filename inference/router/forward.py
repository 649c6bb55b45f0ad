"""The worker call whose answer goes to the client: a decode (or colocated, or a whole-request
prefill) worker's answer relayed as it comes, streamed chunk by chunk or in one piece, with a
failed KV hand-off and a mid-stream failure each told to the client as what they are."""

from __future__ import annotations

import contextlib
import json
import logging

import aiohttp
from aiohttp import web

from inference.router.adaptive import AdaptivePlacer
from inference.router.backends import Backend, KvLease
from inference.router.calls import WorkerCalls
from inference.router.degraded import DegradedMode
from inference.router.errors import error_response, sse_error_message
from inference.router.handoff import PATHS
from inference.router.metrics import RouterMetrics
from inference.router.migration import MAX_MIGRATIONS, StreamRelay, why_not_continuable
from inference.router.prompts import ParsedRequest
from inference.router.pump import Pump
from inference.router.retry import retry_target, untried_worker
from inference.router.timeline import Timeline
from inference.router.upstream import (
    BackendFailure,
    describe,
    never_sent,
    ran_out_of_time,
    relay,
    sse_error,
    stream_usage_counts,
    upstream_message,
    usage_counts,
)

log = logging.getLogger("pdserve.router")

# Names the revision group that served the request (see groups.py), on every answer.
REVISION_HEADER = "X-Pdserve-Revision"


def with_token_ids(body: bytes) -> bytes:
    """``body``, a JSON object, asking the worker for the answer's token ids: the member is
    appended to the bytes rather than the body parsed and serialized again (hot path: once per
    streamed request). Should the client have sent the field too, the last one counts, in
    vLLM's JSON parser as in Python's."""
    head = body.rstrip()[:-1].rstrip()
    return head + (b'"return_token_ids":true}' if head.endswith(b"{") else
                   b',"return_token_ids":true}')


class Forwarder:
    def __init__(self, calls: WorkerCalls, metrics: RouterMetrics, placer: AdaptivePlacer | None,
                 degraded: DegradedMode):
        self.calls = calls
        self.metrics = metrics
        self.placer = placer
        self.degraded = degraded

    async def forward(self, request: web.Request, role: str, parsed: ParsedRequest,
                      body: bytes, timeline: Timeline,
                      handoff: KvLease | None = None,
                      local_prefill: bool = False) -> web.StreamResponse:
        """Send ``body`` (JSON) to one worker of ``role`` and relay its answer, streamed or not.
        ``handoff``: the prefill worker's KV that decode must load; released once decode has
        started answering (the caller releases it on every other way out). ``local_prefill``:
        decode computes the prompt, so its time to the first token measures the prefill speed
        on decode (adaptive.py) unless another worker takes over.

        A worker that fails before anything reached the client is replaced (see
        ``_replacement``); a stream cut mid-way goes on on another worker (migration.py)."""
        blocked = why_not_continuable(parsed) if parsed.stream else "not_streamed"
        if blocked is None:
            # The answer's token ids, which a continuation needs; the client does not see them
            # unless it asked for them itself.
            body = with_token_ids(body)
        stream = StreamRelay(parsed, blocked) if parsed.stream else None
        backend = self.calls.pick(role, parsed)
        tried = [backend]
        while True:
            try:
                return await self._call(request, role, parsed, backend, body, timeline, handoff,
                                        stream, tried, local_prefill and len(tried) == 1)
            except BackendFailure as exc:
                if exc.timed_out or len(tried) > MAX_MIGRATIONS:
                    raise
                # A decode that failed before the first byte and has no peer is dispatch.py's
                # to hand to prefill (degraded mode, the client's own body).
                replacement = self._replacement(role, parsed, exc, tried, to_prefill=False)
                if replacement is None:
                    raise
                failure = exc
                role, backend, reused = replacement
            if failure.unsent and reused:
                # Nothing reached the worker: the same call, KV hand-off and all.
                self.metrics.retries.labels(failure.role).inc()
                timeline.mark(f"{failure.role}_retried")
                reason = "not_sent"
            else:
                reason = "not_sent" if failure.unsent else "before_first_byte"
                if handoff is not None:
                    # The failed decode may have pulled the KV (then prefill freed it) or
                    # died pulling it: the next worker computes the prompt itself.
                    handoff.release()
                    handoff = None
                    body = json.dumps({k: v for k, v in json.loads(body).items()
                                       if k != "kv_transfer_params"}).encode()
            self._migrated(timeline, reason, failure.backend, role, backend, 0)
            log.warning("request %s: %s; %s on %s %s", timeline.request_id, failure,
                        "retrying" if reason == "not_sent" else "migrating", role, backend.url)
            timeline.retried_from = failure.backend.url
            tried.append(backend)

    def _replacement(self, role: str, parsed: ParsedRequest, failure: BackendFailure,
                     tried: list[Backend], to_prefill: bool = True
                     ) -> tuple[str, Backend, bool] | None:
        """Where a request goes after ``failure``: where retry.py says in ``role``; else the
        other role of a PD group (a decode failure goes to prefill in degraded mode, which runs
        the request whole, when ``to_prefill``; a whole request on prefill goes to decode).
        Returns the role, the worker and whether the call is repeated as it was (same role, KV
        hand-off kept)."""
        pools, metrics = self.calls.pools, self.metrics
        backend = retry_target(pools[role], parsed, failure, tried, metrics)
        if backend is not None:
            return role, backend, True
        if role == "decode":
            if not to_prefill or self.degraded.instead_of(pools, "decode") is None:
                return None
            other = "prefill"
        elif role == "prefill" and "decode" in pools:
            other = "decode"
        else:
            return None
        backend = untried_worker(pools[other], parsed, tried, metrics)
        if backend is None:
            return None
        if other == "prefill":
            self.degraded.counted("decode")
        return other, backend, False

    def _migrated(self, timeline: Timeline, reason: str, failed: Backend, role: str,
                  backend: Backend, sent_tokens: int) -> None:
        self.metrics.migrations.labels(reason, failed.role, self.calls.revision).inc()
        timeline.mark_once("migrated")
        timeline.migrations.append({"reason": reason, "from": failed.url, "to": backend.url,
                                    "role": role, "sent_tokens": sent_tokens})

    async def _call(self, request: web.Request, role: str, parsed: ParsedRequest,
                    backend: Backend, body: bytes, timeline: Timeline,
                    handoff: KvLease | None, stream: StreamRelay | None,
                    tried: list[Backend], measure_local: bool) -> web.StreamResponse:
        request_id = timeline.request_id
        self._name(timeline, role, backend)
        # The first dispatch: a retry is marked as such after it.
        timeline.mark_once("decode_dispatched")
        # Not retriable: a failure here may come after chunks reached the client.
        async with self.calls.post(
            backend, PATHS[parsed.endpoint], timeline, retriable=False, data=body,
            headers={"X-Request-Id": request_id, "Content-Type": "application/json"},
        ) as upstream:
            if upstream.status != 200 or stream is None:
                payload = await upstream.read()
                if handoff is not None:
                    handoff.release()
                if upstream.status >= 500 and handoff is not None:
                    return self._handoff_failed(backend, handoff.backend.url, upstream.status,
                                                payload, timeline)
                if upstream.status >= 500:
                    backend.call_failed()
                elif upstream.status == 200:
                    backend.call_succeeded()
                self.metrics.first_byte_seconds.labels(parsed.endpoint, self.calls.revision).observe(
                    timeline.since_arrival())
                timeline.mark("first_token")
                timeline.mark("last_token")
                if upstream.status == 200:
                    timeline.prompt_tokens, timeline.completion_tokens = usage_counts(payload)
                return relay(upstream.status, payload, upstream, request_id)
            return await self._stream(request, role, parsed, backend, upstream, timeline,
                                      handoff, stream, tried, measure_local)

    @staticmethod
    def _name(timeline: Timeline, role: str, backend: Backend) -> None:
        if role == "decode":
            timeline.decode = backend.url
        elif role == "prefill":
            timeline.prefill = backend.url

    async def _stream(self, request: web.Request, role: str, parsed: ParsedRequest,
                      backend: Backend, upstream: aiohttp.ClientResponse,
                      timeline: Timeline, handoff: KvLease | None, stream: StreamRelay,
                      tried: list[Backend], measure_local: bool) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Request-Id": timeline.request_id,
            REVISION_HEADER: self.calls.revision,
        })
        pump = Pump(self.calls, self.metrics, request, response, parsed, timeline, stream,
                    self.placer if measure_local else None)
        outcome = await pump.run(upstream, backend, handoff)
        if isinstance(outcome, BaseException) and not response.prepared:
            # Nothing reached the client: the caller's block turns this into BackendFailure,
            # and forward() tries the request elsewhere from the start.
            raise outcome
        while isinstance(outcome, BaseException):
            outcome, role, backend = await self._go_on(pump, role, backend, outcome, tried)
        if outcome is Pump.ENDED:
            backend.call_succeeded()
            if stream.continuing:
                timeline.completion_tokens = len(stream.sent_ids)
                timeline.prompt_tokens = len(stream.prompt_ids or ())
            else:
                tail = pump.previous + pump.last
                if b'"usage"' in tail:
                    prompt_tokens, completion_tokens = stream_usage_counts(tail)
                    if completion_tokens is not None:
                        timeline.prompt_tokens, timeline.completion_tokens = (
                            prompt_tokens, completion_tokens)
        if outcome is not Pump.CLIENT_GONE:
            timeline.mark("last_token")
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        return response

    async def _go_on(self, pump: Pump, role: str, failed: Backend, exc: BaseException,
                     tried: list[Backend]) -> tuple[object, str, Backend]:
        """After ``failed`` broke off a stream some of which reached the client: the rest from
        another worker, or an SSE error event saying why not. Returns the outcome of what was
        tried (ENDED, CLIENT_GONE, FAILED or the next worker's failure), and where."""
        stream, timeline = pump.stream, pump.timeline
        why_not = None if not ran_out_of_time(exc) else "request_timeout"
        if stream.done:
            return Pump.ENDED, role, failed  # [DONE] was passed on: nothing was lost
        why_not = why_not or stream.why_not_now()
        if why_not is None and stream.finished:
            # Every token was passed on; only the ending was lost.
            wants = bool((pump.parsed.body.get("stream_options") or {}).get("include_usage"))
            await pump.write(stream.tail(wants))
            self._migrated(timeline, "after_last_token", failed, role, failed,
                           len(stream.sent_ids))
            return Pump.ENDED, role, failed
        body = stream.continuation(pump.parsed.body) if why_not is None else None
        if why_not is None and body is None:
            why_not = "length_reached"  # cannot happen without a finish_reason; be safe
        if why_not is None and len(tried) > MAX_MIGRATIONS:
            why_not = "too_many_failures"
        replacement = None
        if why_not is None:
            # A continuation whose connection timed out on a saturated host never reached
            # its worker: with no peer, that worker is tried again (unsent).
            replacement = self._replacement(role, pump.parsed,
                                            BackendFailure(role, failed, describe(exc),
                                                           unsent=never_sent(exc)), tried)
            if replacement is None:
                why_not = "no_worker"
        if why_not is not None or replacement is None:
            self.metrics.migrations_refused.labels(why_not or "no_worker",
                                                   self.calls.revision).inc()
            timeline.error = f"{role} failed mid-stream: {describe(exc)}"
            log.warning("request %s: %s worker %s failed mid-stream (%s); cannot continue: %s",
                        timeline.request_id, role, failed.url, describe(exc), why_not)
            await pump.write(sse_error(role, failed, exc, why_not))
            return Pump.FAILED, role, failed
        next_role, backend, _same = replacement
        tried.append(backend)
        self._migrated(timeline, "mid_stream", failed, next_role, backend, len(stream.sent_ids))
        timeline.retried_from = failed.url
        self._name(timeline, next_role, backend)
        log.warning("request %s: %s worker %s failed mid-stream (%s) after %d tokens; "
                    "continuing on %s %s", timeline.request_id, role, failed.url, describe(exc),
                    len(stream.sent_ids), next_role, backend.url)
        stream.continue_from()
        try:
            async with self.calls.post(
                backend, PATHS["completions"], timeline, retriable=False, json=body,
                headers={"X-Request-Id": timeline.request_id},
            ) as upstream:
                if upstream.status != 200:
                    payload = await upstream.read()
                    if upstream.status >= 500:
                        backend.call_failed()
                    message = (f"{role} worker {failed.url} failed mid-stream "
                               f"({describe(exc)}); its continuation on {backend.url} was "
                               f"answered {upstream.status}: {upstream_message(payload)}")
                    timeline.error = message
                    await pump.write(sse_error_message(message, f"{role}_failed"))
                    return Pump.FAILED, next_role, backend
                outcome = await pump.run(upstream, backend, None)
                if outcome is Pump.ENDED:
                    backend.call_succeeded()
                return outcome, next_role, backend
        except BackendFailure as failure:
            # The continuation's worker failed before its first event (the block's failures
            # are the pump's own): go on from the same place, elsewhere.
            cause = failure.__cause__ if failure.__cause__ is not None else failure
            return cause, next_role, backend

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
