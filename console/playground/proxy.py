"""The playground's chat call: the console forwards it to the deployment's router, streamed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from console.deployments.models import Deployment
from inference.router.config import RouterConfig

# The router answers a larger body with 413 (its --max-body-bytes; the console starts it with
# the default): the console refuses such a chat itself, before the router sees it.
ROUTER_MAX_BODY_BYTES: int = next(f.default for f in dataclasses.fields(RouterConfig)
                                  if f.name == "max_body_bytes")


class BodyTooLarge(Exception):
    """The router's request would exceed its body limit; the message says by how much."""


def build_body(deployment: Deployment, fields: dict[str, Any]) -> dict[str, Any]:
    """The router's request: the checked chat fields (console/playground/api/serializers.py),
    the deployment's model, streamed with usage."""
    return {**fields, "model": deployment.served_model_name, "stream": True,
            "stream_options": {"include_usage": True}}


def encode_body(body: dict[str, Any], limit: int = ROUTER_MAX_BODY_BYTES) -> bytes:
    """The router's request as sent, within the router's body limit, else BodyTooLarge."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    if len(raw) > limit:
        raise BodyTooLarge(f"the request to the router would be {len(raw)} bytes; the router "
                           f"accepts at most {limit} (its body limit): send fewer or smaller "
                           "images")
    return raw


async def stream_chat(deployment_url: str, body: bytes, request_id: str,
                      api_key: str) -> AsyncIterator[bytes]:
    """Yield the router's SSE bytes; a failure becomes one SSE error event, never a hang.
    ``body``: encode_body's JSON. ``api_key``: the console's own key for the deployment
    (console/gateway/router_admin.py)."""
    headers = {"X-Request-Id": request_id, "Authorization": f"Bearer {api_key}",
               "Content-Type": "application/json"}
    timeout = httpx.Timeout(600.0, connect=3.0)
    try:
        async with httpx.AsyncClient(timeout=timeout) as client, client.stream(
            "POST", f"{deployment_url}/v1/chat/completions", content=body, headers=headers
        ) as response:
            if response.status_code != 200:
                yield refusal_event(response.status_code, await response.aread())
                return
            async for chunk in response.aiter_raw():
                yield chunk
    except httpx.HTTPError as exc:
        yield _error_event(f"cannot reach the router at {deployment_url}: {exc}")


def refusal_event(status: int, payload: bytes) -> bytes:
    """The router's error answer as one readable SSE error event: OpenAI's error object's
    message and the field it names (``param``), else the answer's text."""
    text = payload.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if not isinstance(error, dict) or not error.get("message"):
        return _error_event(f"the router answered {status}: {text[:2000]}", status=status)
    param = error.get("param")
    message = f"the router refused the request ({status}): {error['message']}" + (
        f" (field {param})" if param else "")
    return _error_event(message, status=status, param=param)


def _error_event(message: str, **fields: Any) -> bytes:
    return f"data: {json.dumps({'error': {'message': message, **fields}})}\n\n".encode()
