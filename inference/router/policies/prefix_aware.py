"""``prefix_aware``: requests whose prompts start alike go to the same backend, so that vLLM's
prefix cache there already holds the KV of the shared part and only the rest is computed.

The key is a hash of the first N whole KV blocks of the prompt token ids. vLLM caches KV per
whole block, so a shared prefix shorter than a block saves nothing; and it always computes a
prompt's last token itself, so only a prompt longer than N blocks can be served from N cached
blocks. Shorter prompts, and prefixes seen for the first time, go to the least loaded backend,
which then becomes the prefix's home.

Stickiness is bounded by load: a popular prefix (say, one system prompt behind every request)
must not pin all traffic on one backend. When the home has more than ``max(2, 2 x the least
loaded)`` requests in flight, the request goes to the least loaded backend instead; the home is
kept, since its cache is still the warm one once the burst passes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from inference.router.policies.base import B, Candidate, Choice, Policy
from inference.router.policies.least_outstanding import LeastOutstanding

# Prefix homes remembered, least recently used dropped first. An entry is an int and a
# reference (~100 bytes with the dict's overhead), so the table stays under ~10 MB.
TABLE_SIZE = 65_536


class PrefixAware(Policy):
    name = "prefix_aware"
    uses_prompt = True

    def __init__(self, block_size: int, blocks: int, table_size: int = TABLE_SIZE) -> None:
        if block_size < 1 or blocks < 1 or table_size < 1:
            raise ValueError("block_size, blocks and table_size must be positive")
        self.prefix_tokens = block_size * blocks
        self.table_size = table_size
        self._homes: OrderedDict[int, Candidate] = OrderedDict()
        self._least = LeastOutstanding()

    def prefix_key(self, prompt_token_ids: Sequence[int]) -> int | None:
        if len(prompt_token_ids) <= self.prefix_tokens:
            return None
        # Python's hash of a tuple of ints is not randomized per process and costs a few
        # microseconds for a few hundred ids. A collision only sends a request to a backend
        # without its prefix cached: slower, never wrong.
        return hash(tuple(prompt_token_ids[: self.prefix_tokens]))

    def choose(self, ready: Sequence[B], prompt_token_ids: Sequence[int]) -> Choice[B]:
        key = self.prefix_key(prompt_token_ids)
        if key is None:
            return Choice(self._least.least_loaded(ready), "short_prompt")
        home = self._homes.get(key)
        # `in` compares by identity (Backend has eq=False): a home that was removed, or is
        # down, is not among the ready even if a new backend has the same URL.
        if home is None or home not in ready:
            home = self._least.least_loaded(ready)
            self._homes[key] = home
            self._homes.move_to_end(key)
            if len(self._homes) > self.table_size:
                self._homes.popitem(last=False)
            return Choice(home, "prefix_miss")
        self._homes.move_to_end(key)
        fewest = min(b.in_flight for b in ready)
        if home.in_flight > max(2, 2 * fewest):
            return Choice(self._least.least_loaded(ready), "overloaded_fallback")
        return Choice(home, "prefix_hit")
