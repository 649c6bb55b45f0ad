"""The hot path: a request sent on to its deployment's router and the answer relayed, streamed
chunk by chunk (SSE) or in one piece, and the next target tried while nothing has reached the
client yet."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from inference.gateway.config import Deployment
from inference.gateway.flow_control import FlowControl, Refused
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.routes import Route
from inference.router.errors import error_response, sse_error_message
from inference.router.upstream import describe

# Names the deployment whose router answered, on every answer one did.
DEPLOYMENT_HEADER = "X-Pdserve-Deployment"
# pdserve's own headers (a session id for the router's revision pinning, the revision that
# served) pass both ways unchanged.
OWN_PREFIX = "x-pdserve-"
PASSED_ON = ("Authorization", "Accept")
# A router answers these when its deployment cannot serve now (no worker ready, it is stopping):
# another deployment of the alias may.
FALLBACK_STATUSES = frozenset({502, 503, 504})
CONNECT_TIMEOUT_S = 5.0
RETRY_AFTER_S = "5"


class Unanswered(Exception):
    """A target gave no answer worth relaying now: ``reason`` says why, for the 503 that names
    them all; ``answer`` is its error response (502/503/504), relayed if no later target does
    better."""

    def __init__(self, reason: str, answer: web.Response | None = None):
        super().__init__(reason)
        self.reason = reason
        self.answer = answer


class Forwarder:
    def __init__(self, metrics: GatewayMetrics, flows: FlowControl):
        self.metrics = metrics
        self.flows = flows
        self.session: aiohttp.ClientSession | None = None

    async def open(self, _app: web.Application) -> None:
        # One session for every router: connections stay open between requests (keep-alive),
        # and their number is not capped here (each router has its own admission).
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S))

    async def close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def forward(self, request: web.Request, raw: bytes, body: dict[str, Any], route: Route,
                      targets: tuple[Deployment, ...], request_id: str,
                      band: str, flow: str) -> web.StreamResponse:
        """The first answer of ``targets`` in order, each waiting its turn in the target's
        queue (``band``, ``flow``) where it has one. The request's path was checked by the
        caller: it goes on as the client sent it."""
        headers = upstream_headers(request.headers, request_id)
        reasons: list[str] = []
        last: tuple[Deployment, web.Response] | None = None
        failed: Deployment | None = None
        for target in targets:
            if failed is not None:
                self.metrics.fallbacks.labels(route.model, failed.name, target.name).inc()
            failed = target
            if target.router is None:
                reasons.append(f"{target.name}: router not running")
                continue
            # The common case sends the client's bytes untouched; only an alias needs its
            # target's own name in the body.
            data = _with_model(body, target.served_model_name) if route.alias else raw
            try:
                response = await self._admitted(request, target.router + request.raw_path, target,
                                                route.model, data, headers, request_id, band, flow)
            except Unanswered as exc:
                reasons.append(f"{target.name}: {exc.reason}")
                if exc.answer is not None:
                    last = (target, exc.answer)
                continue
            self.metrics.answered(route.model, target.name, response.status)
            return response
        if last is not None:
            deployment, answer = last
            self.metrics.answered(route.model, deployment.name, answer.status)
            return answer
        self.metrics.answered(route.model, "", 503)
        return error_response(
            503, f"no deployment of model '{route.model}' is running ({'; '.join(reasons)})",
            request_id, param="model", code="model_unavailable", headers={"Retry-After": RETRY_AFTER_S})

    async def _admitted(self, request: web.Request, url: str, target: Deployment, model: str,
                        data: bytes, headers: CIMultiDict[str], request_id: str, band: str,
                        flow: str) -> web.StreamResponse:
        """``_call`` once the target's queue lets the request in; a refusal is Unanswered, so
        that an alias's next target may serve the request."""
        queue = self.flows.queue(target.name)
        if queue is None:
            return await self._call(request, url, target, model, data, headers, request_id)
        try:
            waited = await queue.acquire(band, flow)
        except Refused as exc:
            self.metrics.shed.labels(target.name, band, exc.code).inc()
            raise Unanswered(f"{exc.code} in the {band!r} band", error_response(
                exc.status, exc.message, request_id, code=exc.code,
                headers={"Retry-After": str(exc.retry_after_s), DEPLOYMENT_HEADER: target.name}),
            ) from None
        self.metrics.queue_seconds.labels(target.name, band).observe(waited)
        started = time.monotonic()
        try:
            return await self._call(request, url, target, model, data, headers, request_id)
        finally:
            queue.release(time.monotonic() - started, flow)

    async def _call(self, request: web.Request, url: str, target: Deployment, model: str,
                    data: bytes, headers: CIMultiDict[str], request_id: str) -> web.StreamResponse:
        assert self.session is not None, "the app's startup opens the session"
        started = time.perf_counter()
        try:
            # encoded: the path goes on byte for byte as the client sent it.
            upstream = await self.session.post(URL(url, encoded=True), data=data, headers=headers)
        except aiohttp.ClientError as exc:
            raise Unanswered(_why(exc)) from None
        # Leaving this block early (the client went away, the handler is cancelled) closes an
        # unfinished upstream connection rather than reusing it, and the router stops the call
        # in turn.
        async with upstream:
            self.metrics.upstream_seconds.labels(model).observe(time.perf_counter() - started)
            relayed = relayed_headers(upstream.headers, request_id, target.name)
            if upstream.status in FALLBACK_STATUSES:
                try:
                    payload = await upstream.read()
                except aiohttp.ClientError:
                    raise Unanswered(f"answered {upstream.status}") from None
                raise Unanswered(f"answered {upstream.status}",
                                 web.Response(body=payload, status=upstream.status, headers=relayed))
            if upstream.content_type == "text/event-stream":
                return await _stream(request, upstream, relayed, target.name)
            try:
                payload = await upstream.read()
            except aiohttp.ClientError as exc:
                # Its headers came: the router took the request, so it is not sent again.
                return error_response(502, f"the router of deployment {target.name} broke off its "
                                      f"answer: {describe(exc)}", request_id, code="upstream_failed",
                                      headers={DEPLOYMENT_HEADER: target.name})
            return web.Response(body=payload, status=upstream.status, headers=relayed)


async def _stream(request: web.Request, upstream: aiohttp.ClientResponse, headers: CIMultiDict[str],
                  deployment: str) -> web.StreamResponse:
    """Relay a stream as it comes. A client that leaves makes a write raise (or the handler
    cancelled): the caller's ``async with upstream`` then closes the router connection."""
    response = web.StreamResponse(status=upstream.status, headers=headers)
    await response.prepare(request)
    content = upstream.content
    while True:
        try:
            chunk = await content.readany()
        except aiohttp.ClientError as exc:
            # Too late for another deployment (the client has part of the answer): the stream
            # ends with an error event, as a router's own streams do.
            await response.write(sse_error_message(
                f"the router of deployment {deployment} broke off the stream: {describe(exc)}",
                "upstream_failed"))
            break
        if not chunk:
            break
        # hot path: runs per chunk; written as it came, without parsing it
        await response.write(chunk)
    await response.write_eof()
    return response


def upstream_headers(headers: CIMultiDictProxy[str], request_id: str) -> CIMultiDict[str]:
    sent = CIMultiDict({"Content-Type": headers.get("Content-Type", "application/json"),
                        "X-Request-Id": request_id})
    for name in PASSED_ON:
        value = headers.get(name)
        if value is not None:
            sent[name] = value
    for name, value in headers.items():
        if name.lower().startswith(OWN_PREFIX):
            sent.add(name, value)
    return sent


def relayed_headers(headers: CIMultiDictProxy[str], request_id: str, deployment: str) -> CIMultiDict[str]:
    relayed = CIMultiDict({"Content-Type": headers.get("Content-Type", "application/json"),
                           "X-Request-Id": headers.get("X-Request-Id", request_id)})
    retry_after = headers.get("Retry-After")
    if retry_after is not None:
        relayed["Retry-After"] = retry_after
    for name, value in headers.items():
        if name.lower().startswith(OWN_PREFIX):
            relayed.add(name, value)
    relayed[DEPLOYMENT_HEADER] = deployment
    return relayed


def _with_model(body: dict[str, Any], served_model_name: str) -> bytes:
    return json.dumps({**body, "model": served_model_name}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def _why(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"no connection within {CONNECT_TIMEOUT_S:g} s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed before an answer"
    return describe(exc)
