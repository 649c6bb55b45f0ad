"""Who may send a request and how much it costs them: the key check, the rate and concurrency
lease taken before the body is read, the token charge after it is parsed, and the settlement on
every exit (answered, failed, timed out, cancelled). Cheap checks come before any parsing or
tokenizing (Envoy's order), so a key over its limits costs the router almost nothing.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from inference.router.budgets import BudgetExceeded, BudgetMeter
from inference.router.errors import error_response
from inference.router.keys import ApiKey, AuthFailure, Gatekeeper
from inference.router.metrics import RouterMetrics
from inference.router.prompts import CharsPerToken, ParsedRequest
from inference.router.ratelimit import RateLimiter, Refused, Ticket, generated_estimate
from inference.router.timeline import Timeline
from inference.router.tokenizing import TokenizerBusy, Tokenizing


class Admission:
    def __init__(self, gate: Gatekeeper, limiter: RateLimiter, metrics: RouterMetrics,
                 tokenizing: Tokenizing, chars_per_token: CharsPerToken, budgets: BudgetMeter):
        self.gate = gate
        self.limiter = limiter
        self.budgets = budgets
        self.metrics = metrics
        self.tokenizing = tokenizing
        self.chars_per_token = chars_per_token

    def check_auth(self, request: web.Request, request_id: str) -> ApiKey | web.Response | None:
        """The caller's key (None: no key needed, or the legacy PDSERVE_API_KEY), or a 401."""
        try:
            return self.gate.check(request.headers.get("Authorization", ""))
        except AuthFailure as exc:
            self.metrics.auth_failures.labels(exc.reason).inc()
            return error_response(401, exc.message, request_id, code="invalid_api_key",
                                  headers={"WWW-Authenticate": "Bearer"})

    def rate_limited(self, exc: Refused, request_id: str) -> web.Response:
        self.metrics.rate_limited.labels(exc.limit).inc()
        return error_response(429, exc.message, request_id, param=exc.limit,
                              code="rate_limit_exceeded",
                              headers={"Retry-After": str(exc.retry_after_s)})

    def check_budget(self, key: ApiKey, request_id: str) -> web.Response | None:
        """A 429 if the key's or its team's token budget is spent, else None."""
        # hot path: runs once per request; no store call (budgets.py says why)
        try:
            self.budgets.check(key)
        except BudgetExceeded as exc:
            self.metrics.budget_refusals.labels(exc.scope, exc.period).inc()
            return error_response(429, exc.message, request_id, param=exc.param,
                                  code="budget_exceeded",
                                  headers={"Retry-After": str(exc.retry_after_s)})
        return None

    @staticmethod
    def busy(exc: TokenizerBusy, request_id: str) -> web.Response:
        return error_response(503, str(exc), request_id, code="tokenizer_busy",
                              headers={"Retry-After": str(exc.retry_after_s)})

    async def release(self, ticket: Ticket) -> None:
        """Give back the lease of a request that ended before it was admitted whole (a bad body,
        a refusal on tokens, a client that left)."""
        releasing = self.limiter.settle(ticket, 0, None)
        if ticket.store is None or ticket.store is self.limiter.memory:
            await releasing  # never suspends, so a cancellation cannot cut it short
        else:
            await asyncio.shield(releasing)

    async def admit_tokens(self, key: ApiKey, ticket: Ticket | None,
                            parsed: ParsedRequest) -> None:
        if ticket is not None:
            prompt = parsed.prompt
            if prompt.known_length is None and key.limits.prompt_tokens_per_minute:
                # Tokenizing the prompt would cost the router more than the rest of the
                # request: charge an estimate now and the exact count in settle, where vLLM's
                # usage or the PD hand-off has usually brought it for free.
                await self.limiter.admit_tokens(
                    ticket, self.chars_per_token.estimate(prompt.text), parsed.max_tokens,
                    parsed.sequences, exact_prompt_tokens=lambda: self.tokenizing.count(prompt))
            else:
                await self.limiter.admit_tokens(ticket, prompt.known_length or 0,
                                                parsed.max_tokens, parsed.sequences)
        self.metrics.key_requests.labels(key.label).inc()

    async def settle(self, key: ApiKey, ticket: Ticket | None, parsed: ParsedRequest,
                      timeline: Timeline) -> None:
        """Runs on every exit of an admitted request: answered, failed, timed out, cancelled."""
        if ticket is not None:
            ticket.settled = True  # from now on this settles it, whatever cancels the handler
        generated = generated_estimate(timeline.completion_tokens, timeline.stream_chunks,
                                       timeline.endpoint)
        prompt_tokens = timeline.prompt_tokens
        if prompt_tokens is None and ticket is not None and ticket.prompt_charged:
            # The charge was an estimate (an exact count would be known) and the answer brought
            # no usage (a stream that did not ask for it): count now, after its last chunk.
            if parsed.prompt.known_length is None and len(parsed.prompt.text) > \
                    self.tokenizing.inline_chars:
                # Off the loop, and shielded: a client that leaves meanwhile must not keep
                # the lease and the reservation from being given back.
                await asyncio.shield(self._settle_counted(key, ticket, parsed, generated))
                return
            prompt_tokens = len(parsed.prompt_token_ids)
        await self._settle_counted(key, ticket, parsed, generated, prompt_tokens)

    async def _settle_counted(self, key: ApiKey, ticket: Ticket | None, parsed: ParsedRequest,
                              generated: int, prompt_tokens: int | None = None) -> None:
        if prompt_tokens is None and ticket is not None and ticket.prompt_charged:
            prompt_tokens = len(await self.tokenizing.ids(parsed.prompt, may_refuse=False))
        if prompt_tokens is not None and parsed.prompt.text:
            self.chars_per_token.observe(len(parsed.prompt.text), prompt_tokens)
        key.usage.generated_tokens += generated
        key.usage.prompt_tokens += prompt_tokens or 0
        if ticket is None:
            return
        settling = self.limiter.settle(ticket, generated, prompt_tokens)
        if ticket.store in (None, self.limiter.memory) and ticket.token_store in (
                None, self.limiter.memory):
            await settling  # never suspends, so a cancellation cannot cut it short
        else:
            # Shielded: a client that disconnects cancels this handler, and the lease and the
            # unused reservation must still be given back.
            await asyncio.shield(settling)
