"""What a client sends, read without a server error: request bodies as JSON, and aiohttp's own
refusals (no such route, wrong method, body too large) in OpenAI's error shape.

Anything a client can put in a request is a client error here (RequestError, a 4xx naming the
field), never an exception left for aiohttp to answer with a 500.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from inference.router.errors import RequestError, error_response

# Deeper bodies are refused: the router serializes the body again for prefill and decode, at a
# deeper stack than the parse, so a body just within the parser's recursion limit would fail
# there. Real requests (tool schemas included) stay far below.
MAX_DEPTH = 64


def parse_json(raw: bytes) -> Any:
    """The JSON value of a request body. Raises RequestError (400) for anything else."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise RequestError(400, f"the JSON body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        # Malformed JSON, bytes that are not UTF-8, an integer of more than 4,300 digits.
        raise RequestError(400, f"malformed JSON body: {exc}") from None
    # Counting brackets costs little; only a body with many of them is walked.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than(data, MAX_DEPTH):
        raise RequestError(400, f"the JSON body is nested deeper than {MAX_DEPTH} levels")
    return data


def _deeper_than(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own client errors (404 for an unknown path, 405, 413 while an admin handler
    reads its body, 400 for a path it cannot decode) in OpenAI's error shape, as the router's
    handlers answer."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {}
        if isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            message = f"{exc.method} is not allowed on {request.path} (allowed: {allowed})"
            headers["Allow"] = allowed
        elif isinstance(exc, web.HTTPNotFound):
            message = f"no such route: {request.path}"
        else:
            message = exc.text or exc.reason
        return error_response(exc.status, message, headers=headers)
