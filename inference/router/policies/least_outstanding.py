"""``least_outstanding``: the ready backend with the fewest requests in flight; ties are broken
round robin, so an idle pool still spreads requests instead of piling them on the first one."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from inference.router.policies.base import B, Choice, Policy


class LeastOutstanding(Policy):
    name = "least_outstanding"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, ready: Sequence[B], prompt_token_ids: Sequence[int]) -> Choice[B]:
        return Choice(self.least_loaded(ready), "picked")

    def least_loaded(self, ready: Sequence[B]) -> B:
        if len(ready) == 1:
            return ready[0]
        fewest = min(b.in_flight for b in ready)
        candidates = [b for b in ready if b.in_flight == fewest]
        return candidates[next(self._turn) % len(candidates)]
