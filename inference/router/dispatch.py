"""Where an admitted request goes inside its revision group, and the answer when no worker
could serve it: colocated; or, in a PD group, prefilled on decode (local), run whole on prefill,
or prefilled on prefill and handed to decode (handoff.py); served without a role in degraded
mode (degraded.py decides when). The worker call itself, its retries and migrations are
forward.py's."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from inference.router.adaptive import Placement
from inference.router.backends import NoBackendAvailable
from inference.router.config import RouterConfig
from inference.router.errors import error_response
from inference.router.groups import Group
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest
from inference.router.timeline import Timeline
from inference.router.upstream import BackendFailure, RequestTimedOut, UpstreamError

log = logging.getLogger("pdserve.router")


class Dispatcher:
    def __init__(self, config: RouterConfig, metrics: RouterMetrics):
        self.config = config
        self.metrics = metrics

    async def dispatch(self, group: Group, request: web.Request, parsed: ParsedRequest,
                       raw: bytes, timeline: Timeline) -> web.StreamResponse:
        """The answer to the request from ``group``'s workers, or the error saying why none
        could give it."""
        try:
            return await self._route(group, request, parsed, raw, timeline)
        except (BackendFailure, NoBackendAvailable) as exc:
            # A failed call to decode raises only before anything reached the client (a
            # failure mid-stream ends the stream with an error event instead), and so does a
            # prefilled request that finds no decode left (the one it was meant for died while
            # it prefilled): prefill can still answer the whole request.
            timed_out = isinstance(exc, BackendFailure) and exc.timed_out
            if (exc.role != "decode"
                    or group.degraded.instead_of(group.pools, "decode", timed_out=timed_out) is None):
                return self.failed(exc, timeline)
            log.warning("request %s: %s; prefill runs it whole", timeline.request_id, exc)
            try:
                return await self._degraded(group, request, parsed, raw, timeline,
                                            missing="decode")
            except (NoBackendAvailable, BackendFailure, RequestTimedOut, UpstreamError) as again:
                return self.failed(again, timeline)
        except (RequestTimedOut, UpstreamError) as exc:
            return self.failed(exc, timeline)

    def failed(self, exc: Exception, timeline: Timeline) -> web.StreamResponse:
        """The answer to a request no worker could serve."""
        if isinstance(exc, UpstreamError):
            timeline.error = f"worker answered {exc.response.status}"
            return exc.response
        if isinstance(exc, RequestTimedOut):
            return self.timed_out(timeline, "")
        timeline.error = str(exc)
        if isinstance(exc, BackendFailure) and exc.timed_out:
            return self.timed_out(timeline, f" ({exc})")
        role = exc.role if isinstance(exc, (BackendFailure, NoBackendAvailable)) else "worker"
        return error_response(503, str(exc), timeline.request_id, code=f"{role}_unavailable")

    def timed_out(self, timeline: Timeline, detail: str) -> web.Response:
        message = f"request timed out after {self.config.request_timeout_s:g} s{detail}"
        timeline.error = message
        return error_response(504, message, timeline.request_id, code="request_timeout")

    @staticmethod
    def no_group(timeline: Timeline) -> web.Response:
        message = "no revision takes requests: every active group has weight 0"
        timeline.error = message
        return error_response(503, message, timeline.request_id, code="no_revision_routable")

    async def _route(self, group: Group, request: web.Request, parsed: ParsedRequest, raw: bytes,
                     timeline: Timeline) -> web.StreamResponse:
        """Where the request goes in its group, and its answer; a failure raises (see
        dispatch)."""
        pools, forwarder, degraded = group.pools, group.forwarder, group.degraded
        # The client's body goes on as the bytes it came in, unless the hand-off changes it.
        if group.mode == "colocated":
            return await forwarder.forward(request, "colocated", parsed, raw, timeline)
        if not pools["decode"].ready():
            # Decided before prefilling: a prefill for a decode that never comes pins KV
            # blocks on the prefill worker until they time out.
            if degraded.instead_of(pools, "decode") is None:
                raise NoBackendAvailable("decode", pools["decode"].backends)
            return await self._degraded(group, request, parsed, raw, timeline, missing="decode")
        if not pools["prefill"].ready() and degraded.instead_of(pools, "prefill") is not None:
            return await self._degraded(group, request, parsed, raw, timeline, missing="prefill")
        if parsed.whole is not None:
            self.metrics.pd_fallback.labels(parsed.whole, group.revision).inc()
            timeline.kv["whole_on_decode"] = parsed.whole
            return await forwarder.forward(request, "decode", parsed, raw, timeline)
        if parsed.placement is not None or group.placer is not None:
            placement = (Placement(parsed.placement, "asked") if parsed.placement is not None
                         else group.placer.place(len(parsed.prompt_token_ids),
                                                 pools["prefill"].ready(),
                                                 pools["decode"].ready()))
            self.metrics.placements.labels(placement.where, placement.reason).inc()
            timeline.kv["placement"] = placement.where
            if placement.where == "local":
                self.metrics.local_prefill.inc()
                timeline.kv["local_prefill"] = True
                return await forwarder.forward(request, "decode", parsed, raw, timeline,
                                               local_prefill=True)
            if placement.where == "prefill_whole":
                return await forwarder.forward(request, "prefill", parsed, raw, timeline)
        elif (self.config.local_prefill_max_tokens
              and len(parsed.prompt_token_ids) <= self.config.local_prefill_max_tokens):
            self.metrics.local_prefill.inc()
            timeline.kv["local_prefill"] = True
            return await forwarder.forward(request, "decode", parsed, raw, timeline,
                                           local_prefill=True)
        assert group.prefill_stage is not None  # a PD group has a prefill pool
        try:
            decode_body, handoff = await group.prefill_stage.run(parsed, timeline)
        except (NoBackendAvailable, BackendFailure) as exc:
            # Every prefill worker failed or went away while this request waited: the
            # client has received nothing yet, so decode computes the prompt instead.
            timed_out = isinstance(exc, BackendFailure) and exc.timed_out
            if degraded.instead_of(pools, "prefill", timed_out=timed_out) is None:
                raise
            log.warning("request %s: no prefill worker could take it (%s); decode "
                        "prefills it", timeline.request_id, exc)
            return await self._degraded(group, request, parsed, raw, timeline, missing="prefill")
        try:
            return await forwarder.forward(request, "decode", parsed,
                                           json.dumps(decode_body).encode(), timeline,
                                           handoff=handoff)
        finally:
            # Whatever became of the decode call, its KV is no longer waited for.
            if handoff is not None:
                handoff.release()

    async def _degraded(self, group: Group, request: web.Request, parsed: ParsedRequest,
                        raw: bytes, timeline: Timeline, missing: str) -> web.StreamResponse:
        """Serve without ``missing`` (see degraded.py)."""
        group.degraded.counted(missing)
        timeline.kv["degraded"] = f"no {missing} worker ready"
        serving = "prefill" if missing == "decode" else "decode"
        return await group.forwarder.forward(request, serving, parsed, raw, timeline)
