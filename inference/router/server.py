"""The router process: the aiohttp app, its revision groups (groups.py; each request picks one,
selection.py, and stays in it), auth and limits, and where each request goes inside its group
(colocated, decode-local, prefill-whole or a PD hand-off; see handoff.py and forward.py).

    python -m inference.router --served-model-name smollm2 --tokenizer MODEL_DIR \
        --max-model-len 2048 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import uuid
from pathlib import Path

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inference.router.adaptive import AdaptivePlacer, Placement
from inference.router.admin import AdminAPI
from inference.router.admission import Admission
from inference.router.asked_placement import asked_placement
from inference.router.backends import (
    Backend,
    NoBackendAvailable,
    Pool,
    close_sessions,
    probe,
    probe_forever,
)
from inference.router.budgets import BudgetMeter
from inference.router.client_input import openai_errors, parse_json
from inference.router.config import RouterConfig, build_parser, config_from_args
from inference.router.errors import RequestError, error_response
from inference.router.forward import REVISION_HEADER
from inference.router.groups import (
    ACTIVE,
    DRAINING,
    Group,
    LastGroup,
    WarmupPrompt,
    build_group,
    report_state,
)
from inference.router.keys import ApiKey, Gatekeeper, load_key_file
from inference.router.media import MediaGate
from inference.router.metrics import RouterMetrics
from inference.router.prompts import (
    CharsPerToken,
    ParsedRequest,
    Prompt,
    PromptChecker,
)
from inference.router.ratelimit import RateLimiter, Refused, Ticket, generated_estimate
from inference.router.selection import SESSION_HEADER, Selector, session_key
from inference.router.timeline import CLIENT_GONE, Timeline
from inference.router.tokenizing import TokenizerBusy, Tokenizing, default_threads
from inference.router.upstream import (
    BackendFailure,
    RequestTimedOut,
    UpstreamError,
    relay,
)
from inference.router.usage import UsageLedger
from inference.router.warmup import FILLER, PairWarmer, warmup_prompt

log = logging.getLogger("pdserve.router")
timeline_log = logging.getLogger("pdserve.router.timeline")

# vLLM routes that need no PD split: any one ready worker answers them, as vLLM would.
PASSED_THROUGH = ("/tokenize", "/detokenize")
# What vLLM's /tokenize takes of a chat request to render its prompt as the chat call would.
TOKENIZE_FIELDS = ("model", "messages", "tools", "documents", "add_generation_prompt",
                   "continue_final_message", "chat_template", "chat_template_kwargs",
                   "mm_processor_kwargs")

class Router:
    def __init__(self, config: RouterConfig, checker: PromptChecker):
        self.config = config
        self.checker = checker
        self.metrics = RouterMetrics.create()
        self.usage = UsageLedger(config.usage_file)
        # The budgets count with the ledger's clock, so that both agree on the day.
        self.budgets = BudgetMeter(clock=lambda: self.usage.clock())
        self.gate = Gatekeeper(
            load_key_file(config.keys_file, config.served_model_name) if config.keys_file
            else None, legacy_key=config.api_key, model=config.served_model_name,
            on_replace=self.budgets.keys_changed)
        self.budgets.keys_changed(self.gate.key_set)
        self.budgets.load(self.usage.token_totals(self.budgets.month_start()))
        # A PD request makes two worker calls, each within the request timeout; a lease
        # outliving both belongs to a replica that died.
        self.limiter = RateLimiter(config.redis_url, lease_ttl_s=2 * config.request_timeout_s + 30,
                                   on_store_error=self.metrics.rate_limit_store_errors.inc)
        self.chars_per_token = CharsPerToken()
        self.media = MediaGate(config, self.metrics)
        self.tokenizing = Tokenizing(config.tokenize_threads or default_threads(),
                                     config.tokenize_queue)
        self.admission = Admission(self.gate, self.limiter, self.metrics, self.tokenizing,
                                   self.chars_per_token, self.budgets)
        self.warmup: WarmupPrompt | None = None
        if config.kv_warmup_tokens:
            self.warmup = WarmupPrompt(
                warmup_prompt(checker.encode(FILLER, False), config.kv_warmup_tokens),
                vocab_size=len(checker.tokenizer))
        first = build_group(config, self.metrics, config.revision, config.mode,
                            config.start_urls(), weight=100, warmup=self.warmup)
        self.groups: dict[str, Group] = {first.revision: first}
        self.selector = Selector()
        self._tasks: list[asyncio.Task[None]] = []
        self._drains: dict[Backend, asyncio.Task[None]] = {}
        self._group_drains: set[asyncio.Task[None]] = set()
        self._adding: set[str] = set()  # revisions whose group is being added

    # ---- the groups ------------------------------------------------------------------
    @property
    def primary(self) -> Group:
        """The first active group: what the top-level fields of /health and /admin/backends
        describe, as they did when the router had one set of pools. There is always one: the
        last active group cannot be removed."""
        return next(g for g in self.groups.values() if g.state == ACTIVE)

    # The primary group's parts, for callers that know the router as one set of pools.
    @property
    def pools(self) -> dict[str, Pool]:
        return self.primary.pools

    @property
    def placer(self) -> AdaptivePlacer | None:
        return self.primary.placer

    @property
    def warmer(self) -> PairWarmer | None:
        return self.primary.warmer

    def _all_pools(self) -> list[Pool]:
        return [pool for group in self.groups.values() for pool in group.pools.values()]

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self, _app: web.Application) -> None:
        for group in self.groups.values():
            group.open(self.config.connect_timeout_s)
        self._tasks.append(asyncio.create_task(
            probe_forever(self._all_pools, self.config.health_interval_s)))
        self.usage.start()

    async def stop(self, _app: web.Application) -> None:
        try:
            for task in [*self._group_drains, *self._drains.values(), *self._tasks]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for group in self.groups.values():
                await group.stop_warmup()
            await close_sessions(self._all_pools())
            await self.limiter.close()
            self.tokenizing.close()
        finally:
            # Requests have all ended when the app's cleanup runs: what they metered is written
            # now, whatever else failed to close.
            await self.usage.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[openai_errors])
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        for path in PASSED_THROUGH:
            app.router.add_post(path, self.pass_through)
        app.router.add_get("/version", self.pass_through)
        AdminAPI(self, self.config.admin_token, self.usage).add_routes(app)
        return app

    # ---- groups and pools at run time (the admin API calls these) --------------------
    async def add_group(self, revision: str, mode: str, urls: dict[str, tuple[str, ...]],
                        weight: int) -> Group:
        """Add a revision group; its workers are probed at once and take requests (at its
        weight) once ready. Raises ValueError if ``revision`` is a group already."""
        if revision in self.groups or revision in self._adding:
            raise ValueError(f"revision {revision} is a group already")
        self._adding.add(revision)
        # Shielded: an admin client that leaves must not leave a group half added, its
        # sessions open and no one to close them.
        return await asyncio.shield(self._add_group(revision, mode, urls, weight))

    async def _add_group(self, revision: str, mode: str, urls: dict[str, tuple[str, ...]],
                         weight: int) -> Group:
        group = build_group(self.config, self.metrics, revision, mode, urls, weight, self.warmup)
        group.open(self.config.connect_timeout_s)
        # Probed before it joins, so that no request picks it before its workers are known
        # to be ready.
        try:
            await asyncio.gather(*(probe(b, timeout_s=max(self.config.connect_timeout_s, 0.5))
                                   for b in group.backends()))
        finally:
            # Even when cancelled (the router stops): stop() then closes its sessions.
            self._adding.discard(revision)
            self.groups[revision] = group
        self.selector.reset()
        log.info("revision %s added: %s, weight %d, %s", revision, mode, weight,
                 ", ".join(f"{b.role} {b.url} {'ready' if b.healthy else 'not ready'}"
                           for b in group.backends()))
        return group

    def set_weights(self, weights: dict[str, int]) -> None:
        """Give groups new weights (the caller has checked them all), from the next request on."""
        for revision, weight in weights.items():
            self.groups[revision].weight = weight
            if weight == 0:
                # Their sessions go by weight again rather than back here when it returns.
                self.selector.forget(revision)
        self.selector.reset()
        log.info("revision weights: %s", ", ".join(f"{g.revision}={g.weight}"
                                                   for g in self.groups.values()))

    def remove_group(self, revision: str) -> Group:
        """Take a group out of selection now, then drain and remove it. Raises KeyError if
        there is no such group, LastGroup if it is the only active one."""
        group = self.groups[revision]
        if group.state == DRAINING:
            return group
        if not any(g.state == ACTIVE for g in self.groups.values() if g is not group):
            raise LastGroup(revision)
        group.state, group.weight = DRAINING, 0
        self.selector.forget(revision)
        self.selector.reset()
        task = asyncio.create_task(self._drain_group(group))
        self._group_drains.add(task)
        task.add_done_callback(self._group_drains.discard)
        log.info("revision %s removed; draining %d requests", revision, group.requests)
        return group

    async def _drain_group(self, group: Group) -> None:
        await group.stop_warmup()
        # Requests inside the group keep its pools for their retries and fallbacks.
        await group.wait_idle()
        for pool in group.pools.values():
            for backend in list(pool.backends):
                self.remove_backend(pool.role, backend.url, group)
        await asyncio.gather(*(self._drains[b] for b in group.backends() if b in self._drains))
        del self.groups[group.revision]
        self.metrics.forget_group(group.revision)
        log.info("revision %s drained and removed", group.revision)

    async def add_backend(self, role: str, url: str, group: Group | None = None) -> Backend:
        """Add a member to ``role``'s pool of ``group`` (the primary one if None); it takes
        requests once a probe finds it healthy. Raises ValueError if it is a member already."""
        group = group or self.primary
        backend = group.pools[role].add(url)
        backend.open(self.config.connect_timeout_s)
        # Probe now rather than at the next round, so the caller learns at once whether the
        # new member is reachable, and a healthy one serves from the next request on.
        await probe(backend, timeout_s=max(self.config.connect_timeout_s, 0.5))
        log.info("revision %s: %s backend %s added (%s)", group.revision, role, url,
                 "ready" if backend.healthy else f"not ready: {backend.last_error}")
        return backend

    def remove_backend(self, role: str, url: str, group: Group | None = None) -> Backend:
        """Take a member of ``group`` (the primary one if None) out of rotation now and close
        it once its requests have finished. Raises KeyError if ``url`` is not a member."""
        group = group or self.primary
        pool = group.pools[role]
        backend = pool.find(url)
        if backend is None:
            raise KeyError(url)
        pool.remove(backend)
        task = asyncio.create_task(self._drain(group, pool, backend))
        self._drains[backend] = task
        task.add_done_callback(lambda _: self._drains.pop(backend, None))
        log.info("revision %s: %s backend %s removed; draining %d in-flight requests, %d KV "
                 "hand-offs", group.revision, role, url, backend.in_flight, backend.kv_pending)
        return backend

    async def _drain(self, group: Group, pool: Pool, backend: Backend) -> None:
        await backend.drain(self.config.kv_lease_s)
        pool.draining.remove(backend)
        if pool.find(backend.url) is None:
            self.metrics.forget_backend(pool.role, backend.url, group.revision)
        log.info("revision %s: %s backend %s drained and closed", group.revision, pool.role,
                 backend.url)

    # ---- plain endpoints -------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        groups = {
            revision: {**group.health(self.config.degraded_mode), "weight": group.weight,
                       "state": group.state}
            for revision, group in self.groups.items()
        }
        routable = [groups[g.revision] for g in self.groups.values() if g.routable]
        primary = groups[self.primary.revision]
        # The top level is the primary group's, as it was with one set of pools; the status is
        # the best any group that takes requests can do.
        answer: dict[str, object] = {"mode": primary["mode"], "roles": primary["roles"]}
        if "kv_warmup" in primary:
            answer["kv_warmup"] = primary["kv_warmup"]
        degraded = next((g for g in routable if g["status"] == "degraded"), None)
        if any(g["status"] == "ok" for g in routable):
            status = "ok"
        elif degraded is not None:
            status = "degraded"
            answer["degraded"] = degraded["degraded"]
        else:
            status = "unavailable"
        answer["status"] = status
        answer["groups"] = groups
        return web.json_response(answer, status=503 if status == "unavailable" else 200)

    async def prometheus(self, _request: web.Request) -> web.Response:
        report_state(self.metrics, self.groups.values())
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
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
        timeline = Timeline(request.headers.get("X-Request-Id") or uuid.uuid4().hex, "other")
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
            group = self.selector.pick(self.groups,
                                       session_key(request.headers.get(SESSION_HEADER), {}))
            if group is None:
                return self._no_group(timeline)
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
            return self._timed_out(timeline, "")

    def _no_group(self, timeline: Timeline) -> web.Response:
        message = "no revision takes requests: every active group has weight 0"
        timeline.error = message
        return error_response(503, message, timeline.request_id, code="no_revision_routable")

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
            timeline.status = CLIENT_GONE
            self._finish(timeline)
            raise
        if timeline.revision is not None and not response.prepared:
            # A stream names its group before its headers go out (forward.py).
            response.headers[REVISION_HEADER] = timeline.revision
        timeline.status = response.status
        self._finish(timeline)
        return response

    def _finish(self, timeline: Timeline) -> None:
        self.metrics.record_request(timeline)
        timeline_log.info("timeline %s", timeline.to_json())

    async def _serve_inner(self, request: web.Request, endpoint: str,
                           timeline: Timeline) -> web.StreamResponse:
        request_id = timeline.request_id
        if isinstance(key := self.admission.check_auth(request, request_id), web.Response):
            return key
        try:
            placement = asked_placement(request.headers, key)
        except RequestError as exc:
            return exc.response(request_id)
        # The cheap limits first, before the body is even read: a key whose budget is spent, or
        # over its request rate or its concurrency, costs the router no parsing and no
        # tokenizing.
        ticket = None
        if key is not None:
            if (spent := self.admission.check_budget(key, request_id)) is not None:
                return spent
            try:
                ticket = await self.limiter.admit_request(key)
            except Refused as exc:
                return self.admission.rate_limited(exc, request_id)
        try:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return error_response(413, f"request body exceeds {self.config.max_body_bytes} "
                                      "bytes", request_id)
            try:
                parsed = self.checker.parse(endpoint, parse_json(raw))
                # Only a chat request with a part other than text can hold an image: text
                # requests skip this. Checked before any worker is called.
                if parsed.render_on_worker or parsed.whole == "unparsed_messages":
                    body, timeline.images = await self.media.inline(parsed.body)
                    if body is not parsed.body:  # file or remote images, now inlined
                        raw = json.dumps(body).encode()
                    if timeline.images:
                        parsed = dataclasses.replace(parsed, body=body, images=timeline.images)
            except RequestError as exc:
                return exc.response(request_id)
            if placement is not None:
                parsed = dataclasses.replace(parsed, placement=placement)
            answer: web.StreamResponse | None = None
            try:
                answer = await self._serve_parsed(request, parsed, raw, key, ticket, timeline)
                return answer
            finally:
                # Metered on every way out from here, a client that left included (no answer).
                self._meter(key, timeline, answer)
        finally:
            if ticket is not None and not ticket.settled:
                await self.admission.release(ticket)

    async def _serve_parsed(self, request: web.Request, parsed: ParsedRequest, raw: bytes,
                            key: ApiKey | None, ticket: Ticket | None,
                            timeline: Timeline) -> web.StreamResponse:
        # Picked once the body is parsed: its `user` may name the session.
        group = self.selector.pick(self.groups,
                                   session_key(request.headers.get(SESSION_HEADER), parsed.body))
        if group is None:
            return self._no_group(timeline)
        timeline.revision = group.revision
        group.enter()
        try:
            return await self._serve_in(group, request, parsed, raw, key, ticket, timeline)
        finally:
            group.leave()

    def _meter(self, key: ApiKey | None, timeline: Timeline,
               answer: web.StreamResponse | None) -> None:
        """Count an ended request in the usage ledger and its metrics."""
        # hot path: runs once per request
        # A stream is 200 from its first byte: how it ended is in timeline.error (an error
        # event, a worker lost mid-stream and not replaced, a client gone).
        failed = answer is None or answer.status >= 400 or timeline.error is not None
        prompt_tokens = completion_tokens = 0
        # An error answer counts no tokens, as no usage reached its client; a request refused
        # before dispatch has none anyway. A stream that broke off or lost its client counts
        # what it got to.
        if answer is None or answer.status < 400:
            prompt_tokens = timeline.prompt_tokens or 0
            completion_tokens = generated_estimate(timeline.completion_tokens,
                                                   timeline.stream_chunks, timeline.endpoint)
        self.usage.record(key.id if key is not None else "", failed, prompt_tokens,
                          completion_tokens, timeline.since_arrival() * 1000)
        if key is not None:
            self.budgets.record(key, prompt_tokens + completion_tokens)
        self.metrics.record_usage(key.label if key is not None else "", failed, prompt_tokens,
                                  completion_tokens)

    async def _serve_in(self, group: Group, request: web.Request, parsed: ParsedRequest,
                        raw: bytes, key: ApiKey | None, ticket: Ticket | None,
                        timeline: Timeline) -> web.StreamResponse:
        """The request inside its group: everything from here on uses that group's workers."""
        request_id = timeline.request_id
        try:
            if parsed.render_on_worker and group.mode == "pd":
                parsed = await self._render_on_worker(group, parsed, timeline)
            # Then what needs the token count, tokenized off the loop: the exact length check,
            # the key's token limits, and the ids the group routes by.
            if parsed.length_unsettled is not None:
                await self.tokenizing.ids(parsed.prompt)
                self.checker.check_length(parsed)
            if key is not None:
                await self.admission.admit_tokens(key, ticket, parsed)
            if self._routes_by_ids(group, parsed):
                await self.tokenizing.ids(parsed.prompt)
        except RequestError as exc:
            return exc.response(request_id)
        except UpstreamError as exc:  # the worker's own refusal of what it cannot render
            timeline.error = f"worker answered {exc.response.status} to /tokenize"
            return exc.response
        except Refused as exc:
            return self.admission.rate_limited(exc, request_id)
        except TokenizerBusy as exc:
            timeline.error = str(exc)
            return self.admission.busy(exc, request_id)

        try:
            return await self._dispatch(group, request, parsed, raw, timeline)
        finally:
            # Known only if something needed the ids (see prompts.py); a non-streamed answer's
            # usage may have told it too.
            if parsed.prompt.known_length is not None:
                timeline.prompt_tokens = parsed.prompt.known_length
            if key is not None:
                await self.admission.settle(key, ticket, parsed, timeline)
                # A key with a prompt-token limit has its prompt counted in settle when nothing
                # else told it: the usage ledger takes that count too.
                if parsed.prompt.known_length is not None:
                    timeline.prompt_tokens = parsed.prompt.known_length

    @staticmethod
    def _routes_by_ids(group: Group, parsed: ParsedRequest) -> bool:
        """Whether the request's way through ``group`` needs its prompt's token ids: the PD
        hand-off (and its placement), or a policy that picks workers by prompt."""
        if parsed.prompt.known_length is not None:
            return False
        return (group.mode == "pd" and parsed.whole is None) or any(
            pool.policy.uses_prompt for pool in group.pools.values())

    async def _dispatch(self, group: Group, request: web.Request, parsed: ParsedRequest,
                        raw: bytes, timeline: Timeline) -> web.StreamResponse:
        try:
            return await self._route(group, request, parsed, raw, timeline)
        except (BackendFailure, NoBackendAvailable) as exc:
            # A failed call to decode raises only before anything reached the client (a
            # failure mid-stream ends the stream with an error event instead), and so does a
            # prefilled request that finds no decode left (the one it was meant for died while
            # it prefilled): prefill can still answer the whole request.
            timed_out = isinstance(exc, BackendFailure) and exc.timed_out
            if (exc.role != "decode" or timed_out or not self.config.degraded_mode
                    or group.mode != "pd" or not group.pools["prefill"].ready()):
                return self._failed(exc, timeline)
            log.warning("request %s: %s; prefill runs it whole", timeline.request_id, exc)
            try:
                return await self._degraded(group, request, parsed, raw, timeline,
                                            missing="decode")
            except (NoBackendAvailable, BackendFailure, RequestTimedOut, UpstreamError) as again:
                return self._failed(again, timeline)
        except (RequestTimedOut, UpstreamError) as exc:
            return self._failed(exc, timeline)

    def _failed(self, exc: Exception, timeline: Timeline) -> web.StreamResponse:
        """The answer to a request no worker could serve."""
        request_id = timeline.request_id
        if isinstance(exc, UpstreamError):
            timeline.error = f"worker answered {exc.response.status}"
            return exc.response
        if isinstance(exc, RequestTimedOut):
            return self._timed_out(timeline, "")
        timeline.error = str(exc)
        if isinstance(exc, BackendFailure) and exc.timed_out:
            return self._timed_out(timeline, f" ({exc})")
        role = exc.role if isinstance(exc, (BackendFailure, NoBackendAvailable)) else "worker"
        return error_response(503, str(exc), request_id, code=f"{role}_unavailable")

    async def _route(self, group: Group, request: web.Request, parsed: ParsedRequest, raw: bytes,
                     timeline: Timeline) -> web.StreamResponse:
        """Where the request goes in its group, and its answer; a failure raises (see
        _dispatch)."""
        request_id = timeline.request_id
        pools, forwarder, revision = group.pools, group.forwarder, group.revision
        # The client's body goes on as the bytes it came in, unless the hand-off changes it.
        if group.mode == "colocated":
            return await forwarder.forward(request, "colocated", parsed, raw, timeline)
        # ready(), not pick(): pick() would advance the round robin and skew the real pick.
        if not pools["decode"].ready():
            # Decided before prefilling: a prefill for a decode that never comes pins KV
            # blocks on the prefill worker until they time out.
            if not (self.config.degraded_mode and pools["prefill"].ready()):
                raise NoBackendAvailable("decode", pools["decode"].backends)
            return await self._degraded(group, request, parsed, raw, timeline, missing="decode")
        if not pools["prefill"].ready() and self.config.degraded_mode:
            return await self._degraded(group, request, parsed, raw, timeline, missing="prefill")
        if parsed.whole is not None:
            self.metrics.pd_fallback.labels(parsed.whole, revision).inc()
            timeline.kv = {"whole_on_decode": parsed.whole}
            return await forwarder.forward(request, "decode", parsed, raw, timeline)
        if parsed.placement is not None or group.placer is not None:
            placement = (Placement(parsed.placement, "asked") if parsed.placement is not None
                         else group.placer.place(len(parsed.prompt_token_ids),
                                                 pools["prefill"].ready(),
                                                 pools["decode"].ready()))
            self.metrics.placements.labels(placement.where, placement.reason).inc()
            timeline.kv = {"placement": placement.where}
            if placement.where == "local":
                self.metrics.local_prefill.inc()
                timeline.kv["local_prefill"] = True
                return await forwarder.forward(request, "decode", parsed, raw, timeline)
            if placement.where == "prefill_whole":
                return await forwarder.forward(request, "prefill", parsed, raw, timeline)
        elif (self.config.local_prefill_max_tokens
              and len(parsed.prompt_token_ids) <= self.config.local_prefill_max_tokens):
            self.metrics.local_prefill.inc()
            timeline.kv = {"local_prefill": True}
            return await forwarder.forward(request, "decode", parsed, raw, timeline)
        assert group.prefill_stage is not None  # a PD group has a prefill pool
        try:
            decode_body, handoff = await group.prefill_stage.run(parsed, timeline)
        except (NoBackendAvailable, BackendFailure) as exc:
            # Every prefill worker failed or went away while this request waited: the
            # client has received nothing yet, so decode computes the prompt instead.
            timed_out = isinstance(exc, BackendFailure) and exc.timed_out
            if timed_out or not self.config.degraded_mode or not pools["decode"].ready():
                raise
            log.warning("request %s: no prefill worker could take it (%s); decode "
                        "prefills it", request_id, exc)
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
        """Serve without the role that has no ready worker: decode computes the prompt itself
        (a KV consumer answers a request nothing was prefilled for), or prefill runs it whole.
        Slower, but the client gets its answer rather than a 503."""
        self.metrics.degraded.labels(missing, group.revision).inc()
        timeline.kv = {**timeline.kv, "degraded": f"no {missing} worker ready"}
        serving = "prefill" if missing == "decode" else "decode"
        return await group.forwarder.forward(request, serving, parsed, raw, timeline)

    async def _render_on_worker(self, group: Group, parsed: ParsedRequest,
                                timeline: Timeline) -> ParsedRequest:
        """The prompt tokens of a chat request the router cannot render as vLLM does, from a
        ready worker of its group's /tokenize (vLLM's own rendering: tools, tool messages,
        media). Without a worker to ask, the request goes whole to decode, which renders it
        itself."""
        body = {key: parsed.body[key] for key in TOKENIZE_FIELDS if key in parsed.body}
        role = "decode" if group.pools["decode"].ready() else "prefill"
        try:
            backend = group.calls.pick(role, parsed)
            data = await group.calls.call_json(backend, "/tokenize", body, timeline)
        except (NoBackendAvailable, BackendFailure) as exc:
            log.warning("request %s: no worker rendered the chat prompt (%s); decode renders it "
                        "itself", timeline.request_id, exc)
            return dataclasses.replace(parsed, whole="unrendered_chat", render_on_worker=False)
        tokens = data.get("tokens")
        if not (isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)):
            return dataclasses.replace(parsed, whole="unrendered_chat", render_on_worker=False)
        timeline.mark("rendered_on_worker")
        rendered = dataclasses.replace(parsed, prompt=Prompt(ids=tokens), render_on_worker=False)
        self.checker.check_rendered_length(rendered)
        return rendered

    def _timed_out(self, timeline: Timeline, detail: str) -> web.Response:
        message = f"request timed out after {self.config.request_timeout_s:g} s{detail}"
        timeline.error = message
        return error_response(504, message, timeline.request_id, code="request_timeout")


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
    checker = PromptChecker(
        config.tokenizer_path, config.served_model_name, config.max_model_len,
        Path(config.chat_template).read_text(encoding="utf-8") if config.chat_template else None)
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
