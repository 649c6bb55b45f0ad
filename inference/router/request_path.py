"""The path of an inference request (/v1/completions, /v1/chat/completions) through the
router, top-down: its key and cheap limits before the body is read, the body parsed and checked
(images inlined), its group picked (selection.py), what needs the prompt's tokens (the exact
length check, token limits, routing by ids), the dispatch inside the group (dispatch.py), and,
on every way out, its usage metered, its metrics and its timeline line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging

from aiohttp import web

from inference.router.admission import Admission
from inference.router.asked_placement import asked_placement
from inference.router.backends import NoBackendAvailable
from inference.router.budgets import BudgetMeter
from inference.router.client_input import parse_json
from inference.router.config import RouterConfig
from inference.router.dispatch import Dispatcher
from inference.router.errors import RequestError, error_response
from inference.router.forward import REVISION_HEADER
from inference.router.groups import Group
from inference.router.keys import ApiKey
from inference.router.media import MediaGate
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest, Prompt, PromptChecker
from inference.router.ratelimit import RateLimiter, Refused, Ticket, generated_estimate
from inference.router.registry import Registry
from inference.router.selection import SESSION_HEADER, session_key
from inference.router.timeline import CLIENT_GONE, Timeline, new_request_id
from inference.router.tokenizing import TokenizerBusy, Tokenizing
from inference.router.upstream import BackendFailure, UpstreamError
from inference.router.usage import UsageLedger

log = logging.getLogger("pdserve.router")
timeline_log = logging.getLogger("pdserve.router.timeline")

# What vLLM's /tokenize takes of a chat request to render its prompt as the chat call would.
TOKENIZE_FIELDS = ("model", "messages", "tools", "documents", "add_generation_prompt",
                   "continue_final_message", "chat_template", "chat_template_kwargs",
                   "mm_processor_kwargs")


class RequestPath:
    def __init__(self, config: RouterConfig, checker: PromptChecker, metrics: RouterMetrics,
                 admission: Admission, limiter: RateLimiter, tokenizing: Tokenizing,
                 media: MediaGate, usage: UsageLedger, budgets: BudgetMeter,
                 registry: Registry, dispatcher: Dispatcher):
        self.config = config
        self.checker = checker
        self.metrics = metrics
        self.admission = admission
        self.limiter = limiter
        self.tokenizing = tokenizing
        self.media = media
        self.usage = usage
        self.budgets = budgets
        self.registry = registry
        self.dispatcher = dispatcher

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        timeline = Timeline(request.headers.get("X-Request-Id") or new_request_id(), endpoint)
        try:
            response = await self._admitted(request, endpoint, timeline)
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

    async def _admitted(self, request: web.Request, endpoint: str,
                        timeline: Timeline) -> web.StreamResponse:
        """The key and its cheap limits, then the body read and checked; metered on every way
        out once it is parsed."""
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
                answer = await self._in_group(request, parsed, raw, key, ticket, timeline)
                return answer
            finally:
                # Metered on every way out from here, a client that left included (no answer).
                self._meter(key, timeline, answer)
        finally:
            if ticket is not None and not ticket.settled:
                await self.admission.release(ticket)

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

    async def _in_group(self, request: web.Request, parsed: ParsedRequest, raw: bytes,
                        key: ApiKey | None, ticket: Ticket | None,
                        timeline: Timeline) -> web.StreamResponse:
        """The request inside the group it picks: everything from here on uses that group's
        workers, and the group is not drained away while the request lasts."""
        request_id = timeline.request_id
        # Picked once the body is parsed: its `user` may name the session.
        group = self.registry.selector.pick(
            self.registry.groups, session_key(request.headers.get(SESSION_HEADER), parsed.body))
        if group is None:
            return self.dispatcher.no_group(timeline)
        timeline.revision = group.revision
        group.enter()
        try:
            try:
                parsed = await self._with_tokens(group, parsed, key, ticket, timeline)
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
                return await self.dispatcher.dispatch(group, request, parsed, raw, timeline)
            finally:
                # Known only if something needed the ids (see prompts.py); a non-streamed
                # answer's usage may have told it too.
                if parsed.prompt.known_length is not None:
                    timeline.prompt_tokens = parsed.prompt.known_length
                if key is not None:
                    await self.admission.settle(key, ticket, parsed, timeline)
                    # A key with a prompt-token limit has its prompt counted in settle when
                    # nothing else told it: the usage ledger takes that count too.
                    if parsed.prompt.known_length is not None:
                        timeline.prompt_tokens = parsed.prompt.known_length
        finally:
            group.leave()

    async def _with_tokens(self, group: Group, parsed: ParsedRequest, key: ApiKey | None,
                           ticket: Ticket | None, timeline: Timeline) -> ParsedRequest:
        """What needs the prompt's tokens, tokenized off the loop: a chat prompt only a worker
        can render, the exact length check, the key's token limits, the ids the group routes
        by. Raises what the request is refused for."""
        if parsed.render_on_worker and group.mode == "pd":
            parsed = await self._render_on_worker(group, parsed, timeline)
        if parsed.length_unsettled is not None:
            await self.tokenizing.ids(parsed.prompt)
            self.checker.check_length(parsed)
        if key is not None:
            await self.admission.admit_tokens(key, ticket, parsed)
        if self._routes_by_ids(group, parsed):
            await self.tokenizing.ids(parsed.prompt)
        return parsed

    @staticmethod
    def _routes_by_ids(group: Group, parsed: ParsedRequest) -> bool:
        """Whether the request's way through ``group`` needs its prompt's token ids: the PD
        hand-off (and its placement), or a policy that picks workers by prompt."""
        if parsed.prompt.known_length is not None:
            return False
        return (group.mode == "pd" and parsed.whole is None) or any(
            pool.policy.uses_prompt for pool in group.pools.values())

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
