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
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from inference.router.keys import NOT_SCOPED, ApiKey, Limits
from inference.router.redis_client import RedisClient, RedisReplyError

log = logging.getLogger("pdserve.router")

WINDOW_S = 60
DEFAULT_RESERVED_TOKENS = 256
REDIS_RETRY_S = 1.0
REDIS_TIMEOUT_S = 0.5
# Which limit refused, as named in the 429 body and the metric's label.
LIMIT_LABELS = ("requests_per_minute", "prompt_tokens_per_minute", "generated_tokens_per_minute",
                "max_concurrency")
# A slot frees when some request ends, which the router cannot foresee.
CONCURRENCY_RETRY_S = 1
# A Redis that refuses, resets, times out (OSError covers all three) or answers an error.
STORE_ERRORS = (RedisReplyError, OSError)


@dataclass(frozen=True)
class Scope:
    """Whose counters a key's request uses: per limit of LIMIT_LABELS, the key's own (counted
    over every model) or, where ``scoped`` says so, the key's on ``model``."""

    model: str = ""
    scoped: tuple[bool, bool, bool, bool] = NOT_SCOPED

    def name(self, prefix: str, index: int) -> str:
        """The counters' name of limit ``index`` (0-3) in the memory store."""
        return f"{prefix}:m:{self.model}" if self.scoped[index] else prefix


KEY_SCOPE = Scope()


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


class Store(Protocol):
    async def admit(self, prefix: str, costs: tuple[tuple[int, int], ...], max_concurrency: int,
                    lease: str, lease_ttl_s: float, scope: Scope = KEY_SCOPE
                    ) -> tuple[int, int]: ...

    async def settle(self, prefix: str, lease: str | None, window: int,
                     deltas: tuple[int, int], scope: Scope = KEY_SCOPE) -> None: ...


def wait_seconds(previous: float, current: float, cost: int, limit: int, elapsed: float) -> float:
    """How long until ``cost`` fits under ``limit`` in a sliding window now holding ``previous``
    and ``current`` counts, ``elapsed`` (0-1) into the current minute."""
    if cost > limit:
        return WINDOW_S
    if current + cost <= limit and previous > 0:
        # Later in this minute, once enough of last minute has slid out.
        fraction = 1 - (limit - current - cost) / previous
        return max(0.0, (fraction - elapsed) * WINDOW_S)
    # Next minute, once enough of this one has slid out.
    fraction = max(0.0, 1 - (limit - cost) / current) if current > 0 else 0.0
    return ((1 - elapsed) + fraction) * WINDOW_S


class MemoryStore:
    """The counters of one router process. Single-threaded asyncio: each call is atomic."""

    def __init__(self) -> None:
        # (counters' name, limit index) -> [minute, count this minute, count last minute]
        self.counters: dict[tuple[str, int], list[int]] = {}
        self.leases: dict[str, dict[str, float]] = {}

    def _counter(self, prefix: str, index: int, minute: int) -> list[int]:
        counter = self.counters.setdefault((prefix, index), [minute, 0, 0])
        if counter[0] != minute:
            counter[2] = counter[1] if counter[0] == minute - 1 else 0
            counter[1] = 0
            counter[0] = minute
        return counter

    async def admit(self, prefix: str, costs: tuple[tuple[int, int], ...], max_concurrency: int,
                    lease: str, lease_ttl_s: float, scope: Scope = KEY_SCOPE) -> tuple[int, int]:
        now = time.time()
        minute = int(now // WINDOW_S)
        elapsed = (now - minute * WINDOW_S) / WINDOW_S
        for index, (limit, cost) in enumerate(costs):
            if limit and cost:
                _, current, previous = self._counter(scope.name(prefix, index), index, minute)
                if previous * (1 - elapsed) + current + cost > limit:
                    return index + 1, math.ceil(wait_seconds(previous, current, cost, limit, elapsed))
        if max_concurrency:
            leases = self.leases.setdefault(scope.name(prefix, 3), {})
            for stale in [name for name, expiry in leases.items() if expiry <= now]:
                del leases[stale]
            if len(leases) >= max_concurrency:
                return 4, CONCURRENCY_RETRY_S
            leases[lease] = now + lease_ttl_s
        for index, (limit, cost) in enumerate(costs):
            if limit and cost:
                self._counter(scope.name(prefix, index), index, minute)[1] += cost
        return 0, minute

    async def settle(self, prefix: str, lease: str | None, window: int,
                     deltas: tuple[int, int], scope: Scope = KEY_SCOPE) -> None:
        if lease is not None:
            self.leases.get(scope.name(prefix, 3), {}).pop(lease, None)
        minute = int(time.time() // WINDOW_S)
        # Prompt tokens are counter 1, generated tokens counter 2 (as in ``costs``).
        for index, delta in enumerate(deltas, start=1):
            if not delta:
                continue
            counter = self._counter(scope.name(prefix, index), index, minute)
            if delta > 0:
                counter[1] += delta
            elif window == minute:
                counter[1] = max(0, counter[1] + delta)
            elif window == minute - 1:
                counter[2] = max(0, counter[2] + delta)


# KEYS[1]: the key's base name, KEYS[2]: the key's on the request's model. ARGV: limit and cost
# of requests, prompt tokens and generated tokens (limit 0: none), max concurrency (0: none),
# lease id, lease TTL in seconds, then per limit 1-4 '1' if it counts on KEYS[2].
# Returns {0, minute} when admitted, else {limit number 1-4, seconds to wait}.
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local W = __WINDOW__
local minute = math.floor(now / W)
local elapsed = (now - minute * W) / W
local function base_of(i)
  if ARGV[9 + i] == '1' then return KEYS[2] end
  return KEYS[1]
end
for i = 1, 3 do
  local limit = tonumber(ARGV[2 * i - 1])
  local cost = tonumber(ARGV[2 * i])
  if limit > 0 and cost > 0 then
    local base = base_of(i)
    local cur = tonumber(redis.call('GET', base .. ':' .. i .. ':' .. minute) or '0')
    local prev = tonumber(redis.call('GET', base .. ':' .. i .. ':' .. (minute - 1)) or '0')
    if prev * (1 - elapsed) + cur + cost > limit then
      local wait
      if cost > limit then
        wait = W
      elseif cur + cost <= limit and prev > 0 then
        wait = math.max(0, (1 - (limit - cur - cost) / prev - elapsed) * W)
      else
        local f = 0
        if cur > 0 then f = math.max(0, 1 - (limit - cost) / cur) end
        wait = ((1 - elapsed) + f) * W
      end
      return {i, math.ceil(wait)}
    end
  end
end
local maxc = tonumber(ARGV[7])
if maxc > 0 then
  local ck = base_of(4) .. ':c'
  redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
  if redis.call('ZCARD', ck) >= maxc then return {4, __CONCURRENCY_RETRY__} end
  local ttl = tonumber(ARGV[9])
  redis.call('ZADD', ck, now + ttl, ARGV[8])
  redis.call('EXPIRE', ck, math.ceil(ttl) + 10)
end
for i = 1, 3 do
  local limit = tonumber(ARGV[2 * i - 1])
  local cost = tonumber(ARGV[2 * i])
  if limit > 0 and cost > 0 then
    local k = base_of(i) .. ':' .. i .. ':' .. minute
    redis.call('INCRBY', k, cost)
    redis.call('EXPIRE', k, 2 * W + 10)
  end
end
return {0, minute}
""".replace("__WINDOW__", str(WINDOW_S)).replace("__CONCURRENCY_RETRY__", str(CONCURRENCY_RETRY_S))

# KEYS as ADMIT_LUA's. ARGV: lease id ('' for none), the reservation's minute, prompt tokens
# counted minus charged, generated tokens used minus reserved, then per limit 2-4 '1' if it
# counts on KEYS[2].
SETTLE_LUA = """
local function base_of(i)
  if ARGV[3 + i] == '1' then return KEYS[2] end
  return KEYS[1]
end
if ARGV[1] ~= '' then redis.call('ZREM', base_of(4) .. ':c', ARGV[1]) end
for i = 2, 3 do
  local base = base_of(i)
  local delta = tonumber(ARGV[i + 1])
  if delta > 0 then
    local t = redis.call('TIME')
    local k = base .. ':' .. i .. ':' .. math.floor(tonumber(t[1]) / __WINDOW__)
    redis.call('INCRBY', k, delta)
    redis.call('EXPIRE', k, 2 * __WINDOW__ + 10)
  elseif delta < 0 then
    local k = base .. ':' .. i .. ':' .. ARGV[2]
    local v = redis.call('GET', k)
    if v then
      local n = math.max(0, tonumber(v) + delta)
      redis.call('SET', k, n, 'KEEPTTL')
    end
  end
end
return 0
""".replace("__WINDOW__", str(WINDOW_S))


class RedisStore:
    """Counters shared by every replica through one Redis; each call is one atomic script."""

    def __init__(self, url: str) -> None:
        self.client = RedisClient(url, REDIS_TIMEOUT_S, {"admit": ADMIT_LUA, "settle": SETTLE_LUA})

    @staticmethod
    def _bases(prefix: str, scope: Scope) -> list[str]:
        # The hash tag keeps one key's counters, its models' too, in one slot should the Redis
        # be a cluster (a script may only touch keys of one slot).
        base = f"pdserve:rl:{{{prefix}}}"
        return [base, f"{base}:m:{scope.model}"]

    async def admit(self, prefix: str, costs: tuple[tuple[int, int], ...], max_concurrency: int,
                    lease: str, lease_ttl_s: float, scope: Scope = KEY_SCOPE) -> tuple[int, int]:
        args: list[Any] = [value for pair in costs for value in pair]
        args += [max_concurrency, lease, lease_ttl_s, *(int(flag) for flag in scope.scoped)]
        result = await self.client.evalsha("admit", self._bases(prefix, scope), args)
        assert isinstance(result, list)
        return int(result[0]), int(result[1])

    async def settle(self, prefix: str, lease: str | None, window: int,
                     deltas: tuple[int, int], scope: Scope = KEY_SCOPE) -> None:
        await self.client.evalsha("settle", self._bases(prefix, scope),
                                  [lease or "", window, *deltas,
                                   *(int(flag) for flag in scope.scoped[1:])])

    async def close(self) -> None:
        await self.client.close()


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
