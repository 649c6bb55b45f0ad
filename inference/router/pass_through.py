"""The routes that need no PD split, answered as vLLM would: /v1/models by the router itself;
/tokenize, /detokenize and /version relayed to one ready worker of the request's group (decode
first: it renders as chat does). Each pays the key check; the POST routes count as requests
against the key's limits."""

from __future__ import annotations

import json

from aiohttp import web

from inference.router.admission import Admission
from inference.router.config import RouterConfig
from inference.router.dispatch import Dispatcher
from inference.router.errors import RequestError, error_response
from inference.router.forward import REVISION_HEADER
from inference.router.groups import Group
from inference.router.media import MediaGate
from inference.router.metrics import RouterMetrics
from inference.router.ratelimit import RateLimiter, Refused
from inference.router.registry import Registry
from inference.router.selection import SESSION_HEADER, session_key
from inference.router.timeline import Timeline, new_request_id
from inference.router.upstream import BackendFailure, RequestTimedOut, relay

# vLLM routes that need no PD split: any one ready worker answers them, as vLLM would.
PASSED_THROUGH = ("/tokenize", "/detokenize")


class PassThrough:
    def __init__(self, config: RouterConfig, metrics: RouterMetrics, admission: Admission,
                 limiter: RateLimiter, media: MediaGate, registry: Registry,
                 dispatcher: Dispatcher):
        self.config = config
        self.metrics = metrics
        self.admission = admission
        self.limiter = limiter
        self.media = media
        self.registry = registry
        self.dispatcher = dispatcher

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        for path in PASSED_THROUGH:
            app.router.add_post(path, self.pass_through)
        app.router.add_get("/version", self.pass_through)

    async def models(self, request: web.Request) -> web.Response:
        request_id = request.headers.get("X-Request-Id") or new_request_id()
        if isinstance(denied := self.admission.check_auth(request, request_id), web.Response):
            return denied
        return web.json_response({
            "object": "list",
            "data": [{
                "id": self.config.served_model_name,
                "object": "model",
                "created": 0,
                "owned_by": "pdserve",
                "max_model_len": self.config.max_model_len,
            }],
        })

    async def pass_through(self, request: web.Request) -> web.StreamResponse:
        """A vLLM route relayed to one ready worker of the request's group (decode first: it
        renders as chat does)."""
        timeline = Timeline(request.headers.get("X-Request-Id") or new_request_id(), "other")
        if isinstance(key := self.admission.check_auth(request, timeline.request_id), web.Response):
            return key
        ticket = None
        if key is not None and request.method == "POST":
            # /tokenize and /detokenize make a worker tokenize: they count as requests, as the
            # inference routes do (no tokens: they generate none and prefill nothing).
            try:
                ticket = await self.limiter.admit_request(key)
            except Refused as exc:
                return self.admission.rate_limited(exc, timeline.request_id)
            self.metrics.key_requests.labels(key.label).inc()
        try:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return error_response(413, f"request body exceeds {self.config.max_body_bytes} "
                                      "bytes", timeline.request_id)
            if request.path == "/tokenize":
                # vLLM's /tokenize renders chat messages, images included: the same limits.
                try:
                    raw = await self._media_checked(raw, timeline)
                except RequestError as exc:
                    return error_response(exc.status, exc.message, timeline.request_id, exc.param)
            group = self.registry.selector.pick(self.registry.groups,
                                       session_key(request.headers.get(SESSION_HEADER), {}))
            if group is None:
                return self.dispatcher.no_group(timeline)
            group.enter()
            try:
                response = await self._pass_to(group, request, raw, timeline)
            finally:
                group.leave()
            response.headers[REVISION_HEADER] = group.revision
            return response
        finally:
            if ticket is not None:
                await self.admission.release(ticket)

    async def _media_checked(self, raw: bytes, timeline: Timeline) -> bytes:
        """A /tokenize body with its images checked and inlined as a chat request's are."""
        try:
            body = json.loads(raw)
        except ValueError:
            return raw  # vLLM answers it with its own 400
        if not isinstance(body, dict):
            return raw
        checked, timeline.images = await self.media.inline(body)
        return raw if checked is body else json.dumps(checked).encode()

    async def _pass_to(self, group: Group, request: web.Request, raw: bytes,
                       timeline: Timeline) -> web.Response:
        pool = next((p for role in ("decode", "colocated", "prefill")
                     if (p := group.pools.get(role)) is not None and p.ready()), None)
        if pool is None:
            message = "no ready worker (" + "; ".join(
                f"{b.url}: {b.last_error or 'not ready'}"
                for p in group.pools.values() for b in p.backends) + ")"
            return error_response(503, message, timeline.request_id, code="no_worker_ready")
        backend = pool.pick().backend
        headers = {"X-Request-Id": timeline.request_id,
                   "Content-Type": request.headers.get("Content-Type", "application/json")}
        try:
            async with group.calls.post(backend, request.path, timeline, retriable=False,
                                        method=request.method, data=raw,
                                        headers=headers) as upstream:
                payload = await upstream.read()
                return relay(upstream.status, payload, upstream, timeline.request_id)
        except BackendFailure as exc:
            return error_response(503, str(exc), timeline.request_id,
                                  code=f"{exc.role}_unavailable")
        except RequestTimedOut:
            return self.dispatcher.timed_out(timeline, "")
