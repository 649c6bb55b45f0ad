"""The router process: aiohttp server, PD hand-off, streaming pass-through.

    python -m inference.router --served-model-name smollm2 --tokenizer MODEL_DIR \
        --max-model-len 2048 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference.kv_channels import uses_transfer_params
from inference.router.adaptive import AdaptivePlacer, PrefillQueue
from inference.router.admin import AdminAPI
from inference.router.backends import (
    Backend,
    NoBackendAvailable,
    Pool,
    close_sessions,
    open_sessions,
    probe,
    probe_forever,
)
from inference.router.config import RouterConfig, build_parser, config_from_args
from inference.router.keys import ApiKey, AuthFailure, Gatekeeper, load_key_file
from inference.router.metrics import RouterMetrics
from inference.router.policies import make_policy
from inference.router.prompts import ParsedRequest, PromptChecker, RequestError
from inference.router.ratelimit import RateLimiter, Refused, Ticket, generated_estimate
from inference.router.timeline import Timeline
from inference.router.upstream import (
    BackendFailure,
    RequestTimedOut,
    UpstreamError,
    describe,
    error_response,
    prompt_token_ids,
    ran_out_of_time,
    relay,
    sse_error,
    upstream_message,
    usage_counts,
    worth_another_try,
)

log = logging.getLogger("pdserve.router")
timeline_log = logging.getLogger("pdserve.router.timeline")

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# What vLLM's NixlConnector expects on the prefill request to keep the KV for a remote decode.
NIXL_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


class Router:
    def __init__(self, config: RouterConfig, checker: PromptChecker):
        self.config = config
        self.checker = checker
        self.metrics = RouterMetrics.create()
        self.gate = Gatekeeper(load_key_file(config.keys_file) if config.keys_file else None,
                               legacy_key=config.api_key)
        # A PD request makes two worker calls, each within the request timeout; a lease
        # outliving both belongs to a replica that died.
        self.limiter = RateLimiter(config.redis_url, lease_ttl_s=2 * config.request_timeout_s + 30,
                                   on_store_error=self.metrics.rate_limit_store_errors.inc)
        self.channel_uses_params = uses_transfer_params(config.kv_channel)
        if config.mode == "colocated":
            members = {"colocated": (config.colocated_urls, config.colocated_policy)}
        else:
            members = {"prefill": (config.prefill_urls, config.prefill_policy),
                       "decode": (config.decode_urls, config.decode_policy)}
        self.pools = {
            role: Pool(role, urls, make_policy(policy, prefix_block_size=config.prefix_block_size,
                                               prefix_blocks=config.prefix_blocks))
            for role, (urls, policy) in members.items()
        }
        self.placer: AdaptivePlacer | None = None
        if config.mode == "pd" and config.pd_policy == "pd_adaptive":
            self.placer = AdaptivePlacer(floor_tokens=config.local_prefill_max_tokens,
                                         stall_budget_s=config.stall_budget_ms / 1000,
                                         queue=PrefillQueue(config.prefill_slots))
        self._probe_task: asyncio.Task[None] | None = None
        self._drains: set[asyncio.Task[None]] = set()

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self, _app: web.Application) -> None:
        await open_sessions(list(self.pools.values()), self.config.connect_timeout_s)
        self._probe_task = asyncio.create_task(
            probe_forever(list(self.pools.values()), self.config.health_interval_s)
        )

    async def stop(self, _app: web.Application) -> None:
        for task in [*self._drains, *([self._probe_task] if self._probe_task else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await close_sessions(list(self.pools.values()))
        await self.limiter.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        AdminAPI(self, self.config.admin_token).add_routes(app)
        return app

    # ---- pools at run time (the admin API calls these) -------------------------------
    async def add_backend(self, role: str, url: str) -> Backend:
        """Add a member to ``role``'s pool; it takes requests once a probe finds it healthy.
        Raises ValueError if it is a member already."""
        backend = self.pools[role].add(url)
        backend.open(self.config.connect_timeout_s)
        # Probe now rather than at the next round, so the caller learns at once whether the
        # new member is reachable, and a healthy one serves from the next request on.
        await probe(backend, timeout_s=max(self.config.connect_timeout_s, 0.5))
        log.info("%s backend %s added (%s)", role, url,
                 "ready" if backend.healthy else f"not ready: {backend.last_error}")
        return backend

    def remove_backend(self, role: str, url: str) -> Backend:
        """Take a member out of rotation now and close it once its requests have finished.
        Raises KeyError if ``url`` is not a member."""
        pool = self.pools[role]
        backend = pool.find(url)
        if backend is None:
            raise KeyError(url)
        pool.remove(backend)
        task = asyncio.create_task(self._drain(pool, backend))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
        log.info("%s backend %s removed; draining %d in-flight requests", role, url,
                 backend.in_flight)
        return backend

    async def _drain(self, pool: Pool, backend: Backend) -> None:
        await backend.drain()
        pool.draining.remove(backend)
        if pool.find(backend.url) is None:
            self.metrics.forget_backend(pool.role, backend.url)
        log.info("%s backend %s drained and closed", pool.role, backend.url)

    # ---- plain endpoints -------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        roles = {
            role: {
                "ready": len(pool.ready()),
                "total": len(pool.backends),
                "backends": [
                    {"url": b.url, "ready": b.healthy, "in_flight": b.in_flight,
                     "error": b.last_error}
                    for b in pool.backends
                ],
            }
            for role, pool in self.pools.items()
        }
        healthy = all(info["ready"] > 0 for info in roles.values())
        return web.json_response(
            {"status": "ok" if healthy else "unavailable", "mode": self.config.mode, "roles": roles},
            status=200 if healthy else 503,
        )

    async def prometheus(self, _request: web.Request) -> web.Response:
        self.metrics.refresh(self.pools.values(), self.placer)
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        if isinstance(denied := self._check_auth(request, request_id), web.Response):
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

    def _check_auth(self, request: web.Request, request_id: str) -> ApiKey | web.Response | None:
        """The caller's key (None: no key needed, or the legacy PDSERVE_API_KEY), or a 401."""
        try:
            return self.gate.check(request.headers.get("Authorization", ""))
        except AuthFailure as exc:
            self.metrics.auth_failures.labels(exc.reason).inc()
            return error_response(401, exc.message, request_id, code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})

    async def _admit(self, key: ApiKey, parsed: ParsedRequest) -> Ticket | None:
        # Tokenizes the prompt (on demand, see prompts.py) only for a key with a prompt limit.
        prompt_tokens = len(parsed.prompt_token_ids) if key.limits.prompt_tokens_per_minute else 0
        ticket = await self.limiter.admit(key, prompt_tokens, parsed.max_tokens)
        self.metrics.key_requests.labels(key.label).inc()
        return ticket

    async def _settle(self, key: ApiKey, ticket: Ticket | None, timeline: Timeline) -> None:
        """Runs on every exit of an admitted request: answered, failed, timed out, cancelled."""
        generated = generated_estimate(timeline.completion_tokens, timeline.stream_chunks,
                                       timeline.endpoint)
        key.usage.generated_tokens += generated
        key.usage.prompt_tokens += timeline.prompt_tokens or 0
        if ticket is None:
            return
        settling = self.limiter.settle(ticket, generated)
        if ticket.store is self.limiter.memory:
            await settling  # never suspends, so a cancellation cannot cut it short
        else:
            # Shielded: a client that disconnects cancels this handler, and the lease and the
            # unused reservation must still be given back.
            await asyncio.shield(settling)

    # ---- inference -------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        timeline = Timeline(request.headers.get("X-Request-Id") or uuid.uuid4().hex, endpoint)
        try:
            response = await self._serve_inner(request, endpoint, timeline)
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client goes away (handler_cancellation);
            # leaving cancels the calls to the workers, and vLLM aborts their requests.
            self.metrics.client_disconnects.labels(endpoint).inc()
            timeline.error = "client disconnected"
            timeline.status = 499
            self._finish(timeline)
            raise
        timeline.status = response.status
        self._finish(timeline)
        return response

    def _finish(self, timeline: Timeline) -> None:
        self.metrics.record_request(timeline, self.config.mode)
        timeline_log.info("timeline %s", timeline.to_json())

    async def _serve_inner(self, request: web.Request, endpoint: str,
                           timeline: Timeline) -> web.StreamResponse:
        request_id = timeline.request_id
        if isinstance(key := self._check_auth(request, request_id), web.Response):
            return key
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body exceeds {self.config.max_body_bytes} bytes",
                                  request_id)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"malformed JSON body: {exc}", request_id)
        try:
            parsed = self.checker.parse(endpoint, body)
        except RequestError as exc:
            return error_response(exc.status, exc.message, request_id, exc.param, exc.code)
        ticket = None
        if key is not None:
            try:
                ticket = await self._admit(key, parsed)
            except Refused as exc:
                self.metrics.rate_limited.labels(exc.limit).inc()
                return error_response(429, exc.message, request_id, param=exc.limit,
                                      code="rate_limit_exceeded",
                                      headers={"Retry-After": str(exc.retry_after_s)})

        try:
            return await self._dispatch(request, parsed, raw, timeline)
        finally:
            # Known only if something needed the ids (see prompts.py); a non-streamed answer's
            # usage may have told it too.
            if parsed.prompt.known_length is not None:
                timeline.prompt_tokens = parsed.prompt.known_length
            if key is not None:
                await self._settle(key, ticket, timeline)

    async def _dispatch(self, request: web.Request, parsed: ParsedRequest, raw: bytes,
                        timeline: Timeline) -> web.StreamResponse:
        request_id = timeline.request_id
        try:
            # The client's body goes on as the bytes it came in, unless the hand-off changes it.
            if self.config.mode == "colocated":
                return await self._forward(request, "colocated", parsed, raw, timeline)
            if not self.pools["decode"].ready():
                # Fail before prefilling: a prefill for a decode that never comes pins KV blocks
                # on the prefill worker until they time out. (ready(), not pick(): pick() would
                # advance the round robin and skew the later real pick.)
                raise NoBackendAvailable("decode", self.pools["decode"].backends)
            if self.placer is not None:
                placement = self.placer.place(len(parsed.prompt_token_ids),
                                              self.pools["prefill"].ready(),
                                              self.pools["decode"].ready())
                self.metrics.placements.labels(placement.where, placement.reason).inc()
                timeline.kv = {"placement": placement.where}
                if placement.where == "local":
                    self.metrics.local_prefill.inc()
                    timeline.kv["local_prefill"] = True
                    return await self._forward(request, "decode", parsed, raw, timeline)
                if placement.where == "prefill_whole":
                    return await self._forward(request, "prefill", parsed, raw, timeline)
            elif (self.config.local_prefill_max_tokens
                  and len(parsed.prompt_token_ids) <= self.config.local_prefill_max_tokens):
                self.metrics.local_prefill.inc()
                timeline.kv = {"local_prefill": True}
                return await self._forward(request, "decode", parsed, raw, timeline)
            decode_body, handoff_from = await self._prefill(parsed, timeline)
            return await self._forward(request, "decode", parsed, json.dumps(decode_body).encode(),
                                       timeline, handoff_from=handoff_from)
        except NoBackendAvailable as exc:
            timeline.error = str(exc)
            return error_response(503, str(exc), request_id, code=f"{exc.role}_unavailable")
        except BackendFailure as exc:
            timeline.error = str(exc)
            if exc.timed_out:
                return self._timed_out(timeline, f" ({exc})")
            return error_response(503, str(exc), request_id, code=f"{exc.role}_unavailable")
        except RequestTimedOut:
            return self._timed_out(timeline, "")
        except UpstreamError as exc:
            timeline.error = f"worker answered {exc.response.status}"
            return exc.response

    def _timed_out(self, timeline: Timeline, detail: str) -> web.Response:
        message = f"request timed out after {self.config.request_timeout_s:g} s{detail}"
        timeline.error = message
        return error_response(504, message, timeline.request_id, code="request_timeout")

    def _pick(self, role: str, parsed: ParsedRequest, exclude: Backend | None = None) -> Backend:
        pool = self.pools[role]
        choice = pool.pick(parsed.prompt_token_ids if pool.policy.uses_prompt else (), exclude)
        self.metrics.decision(role, pool.policy.name, choice.outcome)
        return choice.backend

    async def _prefill(self, parsed: ParsedRequest,
                       timeline: Timeline) -> tuple[dict[str, Any], str | None]:
        """Run the prompt on a prefill worker. Returns the body to send to decode and the
        prefill worker whose KV decode is to load (None when decode computes the prompt)."""
        body = dict(parsed.body)
        for key in ("stream_options", "min_tokens", "n", "best_of"):
            body.pop(key, None)
        body.update(stream=False, max_tokens=1, return_token_ids=True)
        if parsed.endpoint == "chat":
            body["max_completion_tokens"] = 1
        if self.channel_uses_params:
            body["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)

        if self.placer is None:
            backend = self._pick("prefill", parsed)
        else:
            backend = await self._wait_for_prefill_slot(parsed, timeline)
        timeline.prefill = backend.url
        timeline.mark("prefill_dispatched")
        started = time.perf_counter()
        try:
            data = await self._call_json(backend, PATHS[parsed.endpoint], body, timeline)
        except BackendFailure as failure:
            if not failure.retriable:
                raise
            data = await self._retry_prefill(parsed, body, failure, timeline)
        finally:
            if self.placer is not None:
                self.placer.queue.release(backend, self._free_prefill_chooser(parsed))
        elapsed = time.perf_counter() - started
        self.metrics.prefill_seconds.observe(elapsed)
        timeline.mark("prefill_done")

        prefill_ids = prompt_token_ids(parsed.endpoint, data)
        if self.placer is not None:
            self.placer.remote_speed.observe(
                len(prefill_ids) if prefill_ids is not None else len(parsed.prompt_token_ids),
                elapsed)
        if prefill_ids is not None:
            timeline.prompt_tokens = len(prefill_ids)
        decode_body = dict(parsed.body)
        kv_params = data.get("kv_transfer_params")
        if isinstance(kv_params, dict):
            timeline.kv = {key: kv_params.get(key) for key in
                           ("remote_engine_id", "remote_num_tokens", "remote_prefill_cached_tokens")}
        if prefill_ids is None:
            self.metrics.pd_fallback.labels("no_prompt_token_ids").inc()
            return decode_body, None
        if parsed.endpoint == "completions":
            # Token ids in, so decode's prompt is exactly what prefill computed.
            decode_body["prompt"] = prefill_ids
        elif prefill_ids != parsed.prompt_token_ids:
            # Decode renders chat itself; if that would differ from what prefill computed, a
            # KV hand-off would crash decode (longer) or return wrong text (shorter). Decode
            # computes the prompt itself instead, which is slower but correct.
            self.metrics.pd_fallback.labels("token_mismatch").inc()
            log.warning("request %s: prefill tokens differ from the router's; decode recomputes",
                        timeline.request_id)
            timeline.kv["fallback"] = "token_mismatch"
            return decode_body, None
        if self.channel_uses_params:
            if not kv_params:
                self.metrics.pd_fallback.labels("no_kv_params").inc()
                return decode_body, None
            decode_body["kv_transfer_params"] = kv_params
        return decode_body, timeline.prefill

    def _free_prefill_chooser(self, parsed: ParsedRequest
                              ) -> Callable[[Callable[[Backend], bool]], Backend | None]:
        pool = self.pools["prefill"]

        def choose(is_free: Callable[[Backend], bool]) -> Backend | None:
            try:
                choice = pool.pick(parsed.prompt_token_ids if pool.policy.uses_prompt else (),
                                   only=is_free)
            except NoBackendAvailable:
                return None
            self.metrics.decision("prefill", pool.policy.name, choice.outcome)
            return choice.backend

        return choose

    async def _wait_for_prefill_slot(self, parsed: ParsedRequest, timeline: Timeline) -> Backend:
        assert self.placer is not None
        pool = self.pools["prefill"]

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
                                          self._free_prefill_chooser(parsed), ensure_ready),
                max(remaining, 0.001))
        except TimeoutError:
            raise RequestTimedOut() from None
        self.metrics.prefill_queue_wait_seconds.observe(time.perf_counter() - queued)
        return backend

    async def _retry_prefill(self, parsed: ParsedRequest, body: dict[str, Any],
                             failure: BackendFailure, timeline: Timeline) -> dict[str, Any]:
        """Once, on another ready prefill worker. Safe: the client has received nothing yet,
        and a one-token prefill has no effect a second run could repeat."""
        first = failure.backend
        try:
            backend = self._pick("prefill", parsed, exclude=first)
        except NoBackendAvailable:
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
            return await self._call_json(backend, PATHS[parsed.endpoint], body, timeline)
        except BackendFailure as second:
            raise BackendFailure(
                "prefill", backend,
                f"{second.detail} (retried after prefill worker {first.url} failed: {failure.detail})",
            ) from second

    def _budget(self, timeline: Timeline) -> aiohttp.ClientTimeout:
        """What is left of the request's overall timeout, for the next backend call: a PD
        request makes two calls (three with a retry), and all of them share one budget."""
        remaining = self.config.request_timeout_s - timeline.since_arrival()
        if remaining <= 0:
            raise RequestTimedOut()
        return aiohttp.ClientTimeout(total=remaining, sock_connect=self.config.connect_timeout_s)

    async def _call_json(self, backend: Backend, path: str, body: dict[str, Any],
                         timeline: Timeline) -> dict[str, Any]:
        request_id = timeline.request_id
        timeout = self._budget(timeline)
        backend.acquire()
        try:
            async with backend.client().post(
                path, json=body, headers={"X-Request-Id": request_id},
                timeout=timeout,
            ) as upstream:
                payload = await upstream.read()
                if upstream.status >= 500:
                    # A server error before any token (a crashed engine, an internal error):
                    # worth trying on another worker; the worker itself may well be healthy.
                    self.metrics.backend_errors.labels(backend.role, f"http_{upstream.status}").inc()
                    self._call_failed(backend)
                    raise BackendFailure(backend.role, backend,
                                         f"answered {upstream.status}: {upstream_message(payload)}",
                                         retriable=True)
                if upstream.status != 200:
                    raise UpstreamError(relay(upstream.status, payload, upstream, request_id))
                try:
                    data = json.loads(payload)
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    raise UpstreamError(error_response(
                        502, f"{backend.role} worker {backend.url} answered 200 without a JSON "
                        "object", request_id, code=f"{backend.role}_bad_response"))
                backend.call_succeeded()
                return data
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # ClientPayloadError: the worker died mid-body; not a ClientConnectionError subclass.
            self._backend_failed(backend, exc)
            raise BackendFailure(backend.role, backend, describe(exc),
                                 retriable=worth_another_try(exc),
                                 timed_out=ran_out_of_time(exc)) from exc
        finally:
            backend.release()

    async def _forward(self, request: web.Request, role: str, parsed: ParsedRequest,
                       body: bytes, timeline: Timeline,
                       handoff_from: str | None = None) -> web.StreamResponse:
        """Send ``body`` (JSON) to one worker of ``role`` and relay its answer, streamed or not.
        ``handoff_from``: the prefill worker whose KV cache decode must load."""
        request_id = timeline.request_id
        timeout = self._budget(timeline)
        backend = self._pick(role, parsed)
        if role == "decode":
            timeline.decode = backend.url
        elif role == "prefill":
            timeline.prefill = backend.url
        timeline.mark("decode_dispatched")
        backend.acquire()
        try:
            async with backend.client().post(
                PATHS[parsed.endpoint], data=body,
                headers={"X-Request-Id": request_id, "Content-Type": "application/json"},
                timeout=timeout,
            ) as upstream:
                if upstream.status != 200 or not parsed.stream:
                    payload = await upstream.read()
                    if upstream.status >= 500 and handoff_from is not None:
                        return self._handoff_failed(backend, handoff_from, upstream.status, payload,
                                                    timeline)
                    if upstream.status >= 500:
                        self._call_failed(backend)
                    elif upstream.status == 200:
                        backend.call_succeeded()
                    self.metrics.first_byte_seconds.labels(parsed.endpoint).observe(
                        timeline.since_arrival())
                    timeline.mark("first_token")
                    timeline.mark("last_token")
                    if upstream.status == 200:
                        timeline.prompt_tokens, timeline.completion_tokens = usage_counts(payload)
                    return relay(upstream.status, payload, upstream, request_id)
                response = web.StreamResponse(status=200, headers={
                    "Content-Type": "text/event-stream",
                    "Cache-Control": "no-cache",
                    "X-Request-Id": request_id,
                })
                await response.prepare(request)
                first = True
                try:
                    # hot path: runs once per streamed chunk
                    async for chunk in upstream.content.iter_any():
                        try:
                            await response.write(chunk)
                        except ConnectionResetError:
                            # The client left. Leaving this block closes the connection to
                            # the worker, and vLLM aborts a request whose client is gone.
                            self.metrics.client_disconnects.labels(parsed.endpoint).inc()
                            timeline.error = "client disconnected"
                            return response
                        timeline.stream_chunks += chunk.count(b"data: ")
                        if first:
                            first = False
                            self.metrics.first_byte_seconds.labels(parsed.endpoint).observe(
                                timeline.since_arrival())
                            timeline.mark("first_token")
                            if self.placer is not None and timeline.kv.get("local_prefill"):
                                # The prompt's prefill on decode, plus the wait for the
                                # worker's step in progress: what its streams paused for.
                                self.placer.local_speed.observe(
                                    len(parsed.prompt_token_ids),
                                    (timeline.events["first_token"]
                                     - timeline.events["decode_dispatched"]) / 1000)
                except (TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
                    self._backend_failed(backend, exc)
                    timeline.error = f"{role} failed mid-stream: {describe(exc)}"
                    with contextlib.suppress(ConnectionResetError):
                        await response.write(sse_error(role, backend, exc))
                else:
                    backend.call_succeeded()
                timeline.mark("last_token")
                with contextlib.suppress(ConnectionResetError):
                    await response.write_eof()
                return response
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            self._backend_failed(backend, exc)
            raise BackendFailure(role, backend, describe(exc),
                                 timed_out=ran_out_of_time(exc)) from exc
        finally:
            backend.release()

    def _handoff_failed(self, backend: Backend, prefill_url: str, status: int, payload: bytes,
                        timeline: Timeline) -> web.Response:
        # vLLM answers 500 (after its ~5 s KV load timeout) when decode cannot load the blocks
        # prefill announced: stale or expired transfer params, a prefill that died meanwhile.
        # Its message alone reads like a decode bug; say which hand-off failed.
        message = (f"KV hand-off failed: decode worker {backend.url} could not use the KV cache "
                   f"prefilled by {prefill_url} (decode answered {status}: "
                   f"{upstream_message(payload)})")
        self.metrics.backend_errors.labels("decode", "kv_handoff").inc()
        timeline.error = message
        return error_response(502, message, timeline.request_id, code="kv_handoff_failed")

    def _backend_failed(self, backend: Backend, exc: BaseException) -> None:
        self.metrics.backend_errors.labels(backend.role, type(exc).__name__).inc()
        if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                            aiohttp.ClientPayloadError)):
            # Passive health: stop sending to it now; the probe puts it back when it answers.
            backend.mark(False, describe(exc))
            self._call_failed(backend)

    def _call_failed(self, backend: Backend) -> None:
        # Timeouts are not counted: a slow worker is the probe's business (3 slow probes), and
        # a request may run out of its own budget on a healthy worker.
        if backend.call_failed(self.config.breaker_failures, self.config.breaker_cooldown_s):
            self.metrics.breaker_opened.labels(backend.role, backend.url).inc()
            log.warning("%s worker %s: %s", backend.role, backend.url, backend.last_error)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One timeline line is logged per request: spare each record what the format never prints
    # (a walk up the stack for the caller, thread and process names), as the logging HOWTO's
    # "Optimization" section suggests.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    checker = PromptChecker(config.tokenizer_path, config.served_model_name, config.max_model_len)
    router = Router(config, checker)
    # Loading the tokenizer imports transformers and torch: some 400,000 long-lived objects
    # that every full collection would walk again, pausing all requests for ~0.4 s at a time.
    # Freezing them leaves the collector only what requests allocate.
    gc.collect()
    gc.freeze()
    log.info("router on http://%s:%d mode=%s channel=%s", config.host, config.port, config.mode,
             config.kv_channel)
    # uvloop (a dependency of uvicorn[standard]): ~10 % less CPU per request than asyncio's loop.
    web.run_app(router.app(), host=config.host, port=config.port, access_log=None,
                handler_cancellation=True, print=None, loop=uvloop.new_event_loop())
    # Frozen objects are skipped at interpreter exit too; native extensions (triton, under
    # torch) would then report them as leaked on stderr, which ends up in the router's log.
    gc.unfreeze()
    return 0
