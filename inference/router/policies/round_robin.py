"""``round_robin``: each ready backend in turn, blind to load."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from inference.router.policies.base import Choice, Policy

if TYPE_CHECKING:
    from inference.router.backends import Backend


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, ready: Sequence[Backend], prompt_token_ids: Sequence[int]) -> Choice:
        return Choice(ready[next(self._turn) % len(ready)], "picked")
