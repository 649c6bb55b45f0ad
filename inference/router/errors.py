"""Errors in OpenAI's shape, as vLLM answers them: one body, one status -> type mapping, for
every answer the router (and the gateway) makes up itself, client errors and its own failures
alike. Errors a worker answered are relayed as they came (upstream.py)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

# The OpenAI SDK's exception for each status, which vLLM's error bodies name as their type:
# a client that tells errors apart by type sees the router's as it sees vLLM's.
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
               404: "NotFoundError", 409: "ConflictError", 422: "UnprocessableEntityError",
               429: "RateLimitError"}


def error_type(status: int) -> str:
    if status >= 500:
        return "InternalServerError"
    return ERROR_TYPES.get(status, "BadRequestError")


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code}}


class RequestError(Exception):
    """A request the router answers itself with an error: HTTP status, message, and the
    offending field."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self, request_id: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
        """The answer to the client; ``request_id`` (the inference routes') goes in its
        X-Request-Id header."""
        if request_id is not None:
            headers = {"X-Request-Id": request_id, **(headers or {})}
        return web.json_response(self.body(), status=self.status, headers=headers)


def error_response(status: int, message: str, request_id: str | None = None,
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return RequestError(status, message, param, code).response(request_id, headers)


def sse_error_message(message: str, code: str) -> bytes:
    """An error event ending a stream whose headers (200) went out already."""
    error = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return f"data: {json.dumps(error)}\n\n".encode()
