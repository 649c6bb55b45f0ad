"""Per-key rate limits, split by phase: requests, prompt tokens (prefill) and generated tokens
(decode) per minute, and requests in flight.

A request is counted in two steps. Its request and its concurrency lease are counted when its
headers arrive (``admit_request``), before its body is read: a key over its request rate or its
concurrency is refused without reading, parsing or tokenizing anything, and every request it makes
counts, whatever becomes of it later (a 400, a 413, a 429 on tokens). Its tokens are counted once
the body is parsed (``admit_tokens``): the generated-token reservation needs its ``max_tokens``,
``n`` and ``best_of``, the prompt-token charge its prompt.

Each per-minute limit is a sliding-window counter: this minute's count plus last minute's,
weighted by how much of last minute still lies within the past 60 s (the algorithm of
Cloudflare's and the ``limits`` library's sliding window counter). Generated tokens are reserved
up front (the request's ``max_tokens``, or ``DEFAULT_RESERVED_TOKENS``, times the answers it asks
for, never more than the limit itself) and reconciled when the answer ends, so a short answer
gives back what it did not use. Prompt tokens are charged up front as an estimate when the
exact count is not known yet (tokenizing costs the router more than the rest of a request), and
reconciled with the exact count when the answer ends; only an exact count may refuse a
request. In-flight requests are leases that expire after the request timeout, so a replica that
dies cannot hold a slot forever.

Why not the ``limits`` library: it has no refund (the generated-token reservation needs one),
no concurrency limit, and checks one limit per call; four limits would take three or more Redis
round trips and leave earlier hits counted when a later limit refuses. Here one Lua script
checks all four and applies them only if all pass (one round trip in, one out), and the
in-memory store runs the same arithmetic.

A key's limits on one model (``model_limits`` in the key set, keys.py) are counted apart from
its own: the key's counters are named by its prefix, a model's by prefix and model, and
``Scope`` says, per limit, which of the two a request uses. One script call still checks all
four.

With ``REDIS_URL`` the counters live in Redis and are shared by every router replica. When
Redis fails (refused, timed out), the router falls back to its own in-memory counters for
``REDIS_RETRY_S`` and then tries Redis again: limits stay enforced per replica (fail-open for
the cluster-wide total, closed for any one replica), and inference never stops for want of
Redis. ``pdserve_router_rate_limit_store_errors_total`` counts these failures.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from inference.router.keys import ApiKey, Limits
from inference.router.ratelimit_stores import (
    KEY_SCOPE,
    MemoryStore,
    RedisStore,
    Scope,
    Store,
)
from inference.router.redis_client import RedisReplyError

log = logging.getLogger("pdserve.router")

DEFAULT_RESERVED_TOKENS = 256
REDIS_RETRY_S = 1.0
# Which limit refused, as named in the 429 body and the metric's label.
LIMIT_LABELS = ("requests_per_minute", "prompt_tokens_per_minute", "generated_tokens_per_minute",
                "max_concurrency")
# A Redis that refuses, resets, times out (OSError covers all three) or answers an error.
STORE_ERRORS = (RedisReplyError, OSError)


def scope_of(key: ApiKey) -> Scope:
    return Scope(key.model, key.model_scoped) if key.model else KEY_SCOPE


class Refused(Exception):
    """Over a limit: ``limit`` names it, ``retry_after_s`` is when to try again."""

    def __init__(self, limit: str, retry_after_s: int, message: str):
        super().__init__(message)
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.message = message


@dataclass
class Ticket:
    """What a request holds while it runs: given back by ``RateLimiter.settle``."""

    key: ApiKey
    store: Store | None  # where the request and its lease were counted; None: nowhere
    lease: str | None
    token_store: Store | None = None  # where its tokens were counted; None: nowhere (yet)
    window: int = 0  # the minute the tokens were counted in
    reserved: int = 0  # generated tokens reserved; 0 when the key has no such limit
    prompt_charged: int = 0  # prompt tokens counted; 0 when the key has no such limit
    settled: bool = False


class RateLimiter:
    def __init__(self, redis_url: str | None, lease_ttl_s: float,
                 on_store_error: Callable[[], None] | None = None) -> None:
        self.memory = MemoryStore()
        self.redis = RedisStore(redis_url) if redis_url else None
        self.lease_ttl_s = lease_ttl_s
        self._redis_down_until = 0.0
        self._on_store_error = on_store_error

    def _store(self) -> Store:
        if self.redis is not None and time.monotonic() >= self._redis_down_until:
            return self.redis
        return self.memory

    def _redis_failed(self, exc: BaseException) -> None:
        log.warning("rate-limit store: Redis failed (%s: %s); using this router's in-memory "
                    "counters for %.0f s", type(exc).__name__, exc, REDIS_RETRY_S)
        self._redis_down_until = time.monotonic() + REDIS_RETRY_S
        if self._on_store_error is not None:
            self._on_store_error()

    async def admit_request(self, key: ApiKey) -> Ticket | None:
        """Count a request against ``key``'s request rate and take a concurrency lease, or raise
        Refused. Needs nothing of the body: runs before it is read. None: the key has no limits."""
        limits = key.limits
        if not limits.any:
            return None
        if not (limits.requests_per_minute or limits.max_concurrency):
            return Ticket(key, None, None)
        costs = ((limits.requests_per_minute or 0, 1), (0, 0), (0, 0))
        # uuid4().hex's shape without building a UUID (once per request).
        lease = os.urandom(16).hex() if limits.max_concurrency else None
        refused, value, store = await self._try(key, costs, limits.max_concurrency or 0, lease)
        if refused:
            key.usage.rate_limited += 1
            raise Refused(LIMIT_LABELS[refused - 1], max(1, value),
                          _message(key, refused, costs))
        return Ticket(key, store, lease)

    async def admit_tokens(self, ticket: Ticket, prompt_tokens: int, max_tokens: int | None,
                           sequences: int = 1,
                           exact_prompt_tokens: Callable[[], Awaitable[int]] | None = None) -> None:
        """Count the request's prompt tokens and reserve its generated tokens (``max_tokens``
        for each of its ``sequences``), or raise Refused. ``prompt_tokens`` matters only with a
        prompt limit; with ``exact_prompt_tokens`` it is an estimate, and a refusal by the
        prompt limit is checked again with the exact count before it stands."""
        limits = ticket.key.limits
        charged = prompt_tokens if limits.prompt_tokens_per_minute else 0
        reserved = reservation(limits, max_tokens, sequences)
        if not (charged or reserved):
            return
        refused, value, store, costs = await self._try_tokens(ticket.key, charged, reserved)
        if refused == 2 and exact_prompt_tokens is not None:
            # Nothing was counted by the refusal (all limits or none), so try again exactly.
            exact = await exact_prompt_tokens()
            if exact != charged:
                charged = exact
                refused, value, store, costs = await self._try_tokens(ticket.key, charged, reserved)
        if refused:
            ticket.key.usage.rate_limited += 1
            raise Refused(LIMIT_LABELS[refused - 1], max(1, value),
                          _message(ticket.key, refused, costs))
        ticket.token_store, ticket.window = store, value
        ticket.reserved, ticket.prompt_charged = reserved, charged

    async def _try_tokens(self, key: ApiKey, prompt_tokens: int, reserved: int
                          ) -> tuple[int, int, Store, tuple[tuple[int, int], ...]]:
        limits = key.limits
        costs = ((0, 0), (limits.prompt_tokens_per_minute or 0, prompt_tokens),
                 (limits.generated_tokens_per_minute or 0, reserved))
        refused, value, store = await self._try(key, costs, 0, None)
        return refused, value, store, costs

    async def _try(self, key: ApiKey, costs: tuple[tuple[int, int], ...], max_concurrency: int,
                   lease: str | None) -> tuple[int, int, Store]:
        store = self._store()
        args = (key.prefix, costs, max_concurrency, lease or "", self.lease_ttl_s, scope_of(key))
        try:
            refused, value = await store.admit(*args)
        except STORE_ERRORS as exc:
            self._redis_failed(exc)
            store = self.memory
            refused, value = await store.admit(*args)
        return refused, value, store

    async def settle(self, ticket: Ticket, generated: int, prompt_tokens: int | None) -> None:
        """Give back the lease and what was reserved but not generated (or charge the excess),
        and correct an estimated prompt charge to ``prompt_tokens``, the exact count. A request
        that ended before its tokens were counted gives back its lease only."""
        ticket.settled = True
        counted = ticket.token_store is not None
        generated_delta = generated - ticket.reserved if counted and ticket.reserved else 0
        prompt_delta = (prompt_tokens - ticket.prompt_charged
                        if counted and ticket.prompt_charged and prompt_tokens is not None else 0)
        deltas = (prompt_delta, generated_delta)
        prefix = ticket.key.prefix
        scope = scope_of(ticket.key)
        try:
            if ticket.lease is not None and ticket.store is not None and (
                    ticket.token_store in (None, ticket.store)):
                await ticket.store.settle(prefix, ticket.lease, ticket.window, deltas, scope)
                return
            if ticket.lease is not None and ticket.store is not None:
                # Redis failed between the two counts: each store gives back its own.
                await ticket.store.settle(prefix, ticket.lease, ticket.window, (0, 0), scope)
            if ticket.token_store is not None and any(deltas):
                await ticket.token_store.settle(prefix, None, ticket.window, deltas, scope)
        except STORE_ERRORS as exc:
            # The lease expires by itself after the request timeout.
            self._redis_failed(exc)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()


def reservation(limits: Limits, max_tokens: int | None, sequences: int = 1) -> int:
    """Generated tokens reserved up front: ``max_tokens`` (or DEFAULT_RESERVED_TOKENS) for each
    of the ``sequences`` answers the request asks for (n, best_of, a batch of prompts)."""
    if limits.generated_tokens_per_minute is None:
        return 0
    # Never more than the limit: a request asking for more could otherwise never start, though
    # it may well stop early. The excess, if any, is charged when it ends.
    return min((max_tokens or DEFAULT_RESERVED_TOKENS) * max(1, sequences),
               limits.generated_tokens_per_minute)


def generated_estimate(completion_tokens: int | None, stream_chunks: int, endpoint: str) -> int:
    """Tokens an answer generated: its usage (a non-streamed answer's, or the usage event of a
    stream whose client asked for one); otherwise a stream's SSE events less the framing ones
    (vLLM streams one event per token step; chat opens with a role-only event; both end with
    [DONE])."""
    if completion_tokens is not None:
        return completion_tokens
    return max(0, stream_chunks - (2 if endpoint == "chat" else 1))


def _message(key: ApiKey, refused: int, costs: tuple[tuple[int, int], ...]) -> str:
    # A model's own limit says so: the same key may well be within its limits on other models.
    where = f" on model {key.model!r}" if key.model_scoped[refused - 1] else ""
    if refused == 4:
        return (f"rate limit exceeded: max_concurrency{where} ({key.limits.max_concurrency} "
                "requests in flight)")
    limit, cost = costs[refused - 1]
    name = LIMIT_LABELS[refused - 1]
    if cost > limit:
        return (f"rate limit exceeded: this request needs {cost}, more than {name}{where} "
                f"({limit}) allows")
    return f"rate limit exceeded: {name}{where} ({limit})"
