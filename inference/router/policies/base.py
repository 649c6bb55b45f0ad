"""The interface every routing policy implements.

A policy sees only the ready members of one role's pool (the pool has already dropped the
unhealthy and the draining) and the request's prompt token ids, and names the backend to use
plus an ``outcome`` label that says why, for ``pdserve_router_policy_decisions_total``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar


class Candidate(Protocol):
    """What a policy reads of a pool's member (backends.Backend, which builds its pools from
    this package, so the policies do not name it): its requests in flight. Members are told
    apart by identity."""

    in_flight: int


B = TypeVar("B", bound=Candidate)


@dataclass(frozen=True, slots=True)
class Choice(Generic[B]):
    backend: B
    outcome: str


class Policy(ABC):
    """One instance per pool, so counters and tables are per role. Runs once per request on the
    event loop: keep ``choose`` O(pool size) and free of awaits."""

    name: ClassVar[str]
    # Whether choose() reads the prompt's token ids. The router tokenizes a prompt only when
    # something needs its ids, so a policy that does not gets an empty sequence.
    uses_prompt: ClassVar[bool] = False

    @abstractmethod
    def choose(self, ready: Sequence[B], prompt_token_ids: Sequence[int]) -> Choice[B]:
        """Pick one of ``ready`` (never empty)."""
