"""What the router makes of its workers' answers: failures, relayed errors, usage, token ids."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from inference.router.backends import Backend
from inference.router.errors import sse_error_message


class BackendFailure(Exception):
    """A backend failed a request. ``retriable``: the failure happened before anything reached
    the client and the call can be repeated elsewhere."""

    def __init__(self, role: str, backend: Backend, detail: str, retriable: bool = False,
                 timed_out: bool = False, unsent: bool = False):
        super().__init__(f"{role} worker {backend.url} failed: {detail}")
        self.role = role
        self.backend = backend
        self.detail = detail
        self.retriable = retriable
        # The request's overall time budget ran out during this call.
        self.timed_out = timed_out
        # No connection was made: the worker never saw the request.
        self.unsent = unsent


class RequestTimedOut(Exception):
    """The request's overall time budget ran out before a backend call could start."""


class UpstreamError(Exception):
    """A backend answered with an error status; relay it to the client unchanged."""

    def __init__(self, response: web.Response):
        super().__init__(response.status)
        self.response = response


def relay(status: int, payload: bytes, upstream: aiohttp.ClientResponse,
           request_id: str) -> web.Response:
    return web.Response(
        body=payload, status=status,
        headers={"Content-Type": upstream.headers.get("Content-Type", "application/json"),
                 "X-Request-Id": request_id},
    )


def usage_counts(payload: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a non-streamed answer's usage, where given."""
    try:
        usage = json.loads(payload).get("usage") or {}
    except (ValueError, AttributeError):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None)


def stream_usage_counts(tail: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from the usage event that ends a stream whose client
    asked for it (``stream_options.include_usage``), found in the stream's last bytes."""
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            counts = usage_counts(line[6:])
            if counts != (None, None):
                return counts
    return None, None


def prompt_token_ids(endpoint: str, data: dict[str, Any]) -> list[int] | None:
    if endpoint == "chat":
        ids = data.get("prompt_token_ids")
    else:
        choices = data.get("choices") or [{}]
        ids = choices[0].get("prompt_token_ids")
    return list(ids) if isinstance(ids, list) else None


def upstream_message(payload: bytes, limit: int = 500) -> str:
    """The message of a worker's error body (OpenAI or FastAPI shape), else its start."""
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        nested = error.get("message") if isinstance(error, dict) else error
        for message in (nested, data.get("message"), data.get("detail")):
            if isinstance(message, str) and message:
                return message[:limit]
    return payload[:limit].decode("utf-8", "replace") or "(empty body)"


def worth_another_try(exc: BaseException) -> bool:
    # A refused, reset or broken connection may well work on another worker. A request that
    # used up its time budget must not take as long again; but a connect timeout never reached
    # the worker, so it is no such case.
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return True
    return not isinstance(exc, TimeoutError)


def never_sent(exc: BaseException) -> bool:
    """The connection itself failed (refused, unreachable, connect timeout): nothing of the
    request reached the worker."""
    return isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError))


def ran_out_of_time(exc: BaseException) -> bool:
    """The call hit its total budget (not merely a connect timeout)."""
    return isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError)


def describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def sse_error(role: str, backend: Backend, exc: BaseException, why_not: str | None = None) -> bytes:
    message = f"{role} worker {backend.url} failed mid-stream: {describe(exc)}"
    if why_not is not None:
        message += f"; the stream cannot go on on another worker: {CANNOT_CONTINUE.get(why_not, why_not)}"
    return sse_error_message(message, f"{role}_failed")


# Why a stream cut mid-way was not continued, as the client's error event says it
# (migration.py's reasons).
CANNOT_CONTINUE = {
    "several_sequences": "it asks for several sequences (n, best_of or a batch of prompts)",
    "logprobs": "it asks for logprobs",
    "echo": "it echoes its prompt",
    "structured_output": "its output is constrained (response_format, structured outputs)",
    "tools": "it offers tools",
    "stop_strings": "it has stop strings (vLLM holds back text that may begin one)",
    "no_token_ids": "the worker did not return the answer's token ids",
    "parsed_output": "the worker parses tool calls or reasoning out of the answer",
    "worker_error_event": "the worker sent an error event",
    "unreadable_event": "the worker sent an event that is not JSON",
    "request_timeout": "the request's time is up",
    "no_worker": "no other ready worker",
    "too_many_failures": "each worker it was tried on failed",
    "length_reached": "its answer has all its tokens",
}
