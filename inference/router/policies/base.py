"""The interface every routing policy implements.

A policy sees only the ready members of one role's pool (the pool has already dropped the
unhealthy and the draining) and the request's prompt token ids, and names the backend to use
plus an ``outcome`` label that says why, for ``pdserve_router_policy_decisions_total``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    # Only for annotations: backends.py imports this module to build its pools.
    from inference.router.backends import Backend


@dataclass(frozen=True, slots=True)
class Choice:
    backend: Backend
    outcome: str


class Policy(ABC):
    """One instance per pool, so counters and tables are per role. Runs once per request on the
    event loop: keep ``choose`` O(pool size) and free of awaits."""

    name: ClassVar[str]
    # Whether choose() reads the prompt's token ids. The router tokenizes a prompt only when
    # something needs its ids, so a policy that does not gets an empty sequence.
    uses_prompt: ClassVar[bool] = False

    @abstractmethod
    def choose(self, ready: Sequence[Backend], prompt_token_ids: Sequence[int]) -> Choice:
        """Pick one of ``ready`` (never empty)."""
