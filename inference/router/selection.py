"""Which revision group a request goes to: by weight, and sticky per client session.

Weights are applied by nginx's smooth weighted round robin: deterministic, exact over every
cycle of sum(weights) picks, and interleaved (weights 90/10 give one green request in every ten,
not ten in a row). Only groups that are active with a weight above 0 are ever chosen.

A session (the ``X-Session-Id`` header, else the body's ``user`` field, OpenAI's end-user id)
keeps the group it was first given while that group stays routable, so that one conversation
does not flip between revisions mid-rollout; otherwise it is given one by weight again.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Mapping
from typing import Any

from inference.router.groups import Group

SESSION_HEADER = "X-Session-Id"
MAX_SESSIONS = 100_000
# Longer ids are kept as a digest: the map holds up to MAX_SESSIONS of them.
KEPT_ID_CHARS = 64


def session_key(header: str | None, body: Mapping[str, Any]) -> str | None:
    """The request's session, if it names one: the header, else the body's string ``user``.
    The two are kept apart, so that a header value never matches a ``user``."""
    if header:
        key = "h:" + header
    elif isinstance(user := body.get("user"), str) and user:
        key = "u:" + user
    else:
        return None
    if len(key) > KEPT_ID_CHARS:
        return "#" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return key


class Selector:
    def __init__(self, max_sessions: int = MAX_SESSIONS):
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session -> revision, LRU first
        self._current: dict[str, int] = {}  # smooth WRR: each candidate's current weight
        self._candidates: tuple[str, ...] = ()

    def pick(self, groups: Mapping[str, Group], session: str | None) -> Group | None:
        """The group for a request of ``session`` (None: no session); None when no group is
        routable."""
        if session is not None and (revision := self._sessions.get(session)) is not None:
            group = groups.get(revision)
            if group is not None and group.routable:
                self._sessions.move_to_end(session)
                return group
        group = self._weighted([g for g in groups.values() if g.routable])
        if group is not None and session is not None:
            self._sessions[session] = group.revision
            self._sessions.move_to_end(session)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        return group

    def _weighted(self, candidates: list[Group]) -> Group | None:
        if not candidates:
            return None
        names = tuple(g.revision for g in candidates)
        if names != self._candidates:
            self.reset()
            self._candidates = names
        total = 0
        best = candidates[0]
        for group in candidates:
            self._current[group.revision] = self._current.get(group.revision, 0) + group.weight
            total += group.weight
            if self._current[group.revision] > self._current[best.revision]:
                best = group
        self._current[best.revision] -= total
        return best

    def reset(self) -> None:
        """Start the round robin afresh: the weights changed."""
        self._current.clear()

    def forget(self, revision: str) -> None:
        """Drop the sessions held by ``revision``: they are given a group by weight again."""
        for session in [s for s, r in self._sessions.items() if r == revision]:
            del self._sessions[session]

    def sessions(self) -> dict[str, int]:
        """Sticky sessions held, per revision."""
        return dict(Counter(self._sessions.values()))
