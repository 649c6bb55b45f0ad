"""Per-request timeline: when each step of a request happened, logged as one JSON line.

The router prints ``timeline {...}`` when a request ends; the console stores the router's
output like any other log line, so the request page finds it by request id and joins it with
the prefill and decode workers' lines for the same id.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

# Steps in the order they happen; each is stored as ms since the request arrived.
EVENTS = ("received", "prefill_queued", "prefill_dispatched", "prefill_retried", "prefill_done",
          "decode_dispatched", "decode_retried", "first_token", "migrated", "last_token")

# json.dumps with any option but the defaults builds a new encoder per call (hot path).
COMPACT = json.JSONEncoder(separators=(",", ":"))

# nginx's status for a client that closed the connection before the answer was done: the
# status a request's timeline ends with when its client goes away.
CLIENT_GONE = 499


# Request ids: 20 random hex digits drawn once per process, then a 12-digit count.
_ID_PREFIX = os.urandom(10).hex()
_ids = itertools.count()


def new_request_id() -> str:
    """An id for a request that came without X-Request-Id, 32 hex digits as uuid4().hex's:
    unique within the process by its count, across processes and restarts by its random prefix,
    and made without a system call or a UUID object (hot path: once per request)."""
    return f"{_ID_PREFIX}{next(_ids) % 16**12:012x}"


@dataclass
class Timeline:
    request_id: str
    endpoint: str
    # The revision group that served the request (None: refused before one was picked).
    revision: str | None = None
    arrived: float = field(default_factory=time.perf_counter)
    wall_start: float = field(default_factory=time.time)
    events: dict[str, float] = field(default_factory=dict)
    prefill: str | None = None
    decode: str | None = None
    # The worker that failed before the one named in `prefill` (or `decode`) was tried instead.
    retried_from: str | None = None
    # Each move to another worker after a failure (forward.py): reason, from, to, role and
    # the tokens the client had been sent by then.
    migrations: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    stream_chunks: int = 0
    # Image parts the request carried (each checked and, if a file or remote, inlined: media.py).
    images: int = 0
    streamed: bool = False
    # Where the prompt was prefilled and how it was handed over: each stage adds its part
    # (placement, the transfer's parameters, a fallback), none replaces what is there.
    kv: dict[str, Any] = field(default_factory=dict)
    status: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.events["received"] = 0.0

    def mark(self, event: str) -> None:
        self.events[event] = round((time.perf_counter() - self.arrived) * 1000, 3)

    def mark_once(self, event: str) -> None:
        if event not in self.events:
            self.mark(event)

    def since_arrival(self) -> float:
        return time.perf_counter() - self.arrived

    def to_json(self) -> str:
        return COMPACT.encode({
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "revision": self.revision,
            "start": round(self.wall_start, 6),
            "events_ms": self.events,
            "prefill": self.prefill,
            "decode": self.decode,
            "retried_from": self.retried_from,
            "migrations": self.migrations,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "stream_chunks": self.stream_chunks,
            "images": self.images,
            "kv": self.kv,
            "status": self.status,
            "error": self.error,
        })
