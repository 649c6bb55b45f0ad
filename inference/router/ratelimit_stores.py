"""Where the rate limits' counters live (ratelimit.py decides what is counted): a router's own
memory, or one Redis shared by its replicas, each call one atomic script. Both run the same
sliding-window arithmetic and answer a refusal with which limit and how long to wait."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from inference.router.keys import NOT_SCOPED
from inference.router.redis_client import RedisClient

WINDOW_S = 60
REDIS_TIMEOUT_S = 0.5
# A slot frees when some request ends, which the router cannot foresee.
CONCURRENCY_RETRY_S = 1


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
