"""``round_robin``: each ready backend in turn, blind to load."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from inference.router.policies.base import B, Choice, Policy


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, ready: Sequence[B], prompt_token_ids: Sequence[int]) -> Choice[B]:
        return Choice(ready[next(self._turn) % len(ready)], "picked")
