"""Routing policies, one module each behind ``Policy`` (see base.py); chosen per role."""

from __future__ import annotations

from inference.router.policies.base import Choice, Policy
from inference.router.policies.least_outstanding import LeastOutstanding
from inference.router.policies.prefix_aware import PrefixAware
from inference.router.policies.round_robin import RoundRobin

POLICY_NAMES = (RoundRobin.name, LeastOutstanding.name, PrefixAware.name)


def make_policy(name: str, *, prefix_block_size: int, prefix_blocks: int) -> Policy:
    if name == RoundRobin.name:
        return RoundRobin()
    if name == LeastOutstanding.name:
        return LeastOutstanding()
    if name == PrefixAware.name:
        return PrefixAware(block_size=prefix_block_size, blocks=prefix_blocks)
    raise ValueError(f"unknown routing policy {name!r} (one of {', '.join(POLICY_NAMES)})")


__all__ = ["POLICY_NAMES", "Choice", "LeastOutstanding", "Policy", "PrefixAware", "RoundRobin",
           "make_policy"]
