"""The playground's chat call: the console forwards it to the deployment's router, streamed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from console.deployments.models import Deployment


def build_body(deployment: Deployment, fields: dict[str, Any]) -> dict[str, Any]:
    """The router's request: the checked chat fields (console/playground/api/serializers.py),
    the deployment's model, streamed with usage."""
    return {**fields, "model": deployment.served_model_name, "stream": True,
            "stream_options": {"include_usage": True}}


async def stream_chat(deployment_url: str, body: dict[str, Any], request_id: str,
                      api_key: str) -> AsyncIterator[bytes]:
    """Yield the router's SSE bytes; a failure becomes one SSE error event, never a hang.
    ``api_key``: the console's own key for the deployment (console/gateway/router_admin.py)."""
    headers = {"X-Request-Id": request_id, "Authorization": f"Bearer {api_key}"}
    timeout = httpx.Timeout(600.0, connect=3.0)
    try:
        async with httpx.AsyncClient(timeout=timeout) as client, client.stream(
            "POST", f"{deployment_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", errors="replace")
                yield _error_event(f"router answered {response.status_code}: {detail}")
                return
            async for chunk in response.aiter_raw():
                yield chunk
    except httpx.HTTPError as exc:
        yield _error_event(f"cannot reach the router at {deployment_url}: {exc}")


def _error_event(message: str) -> bytes:
    return f"data: {json.dumps({'error': {'message': message}})}\n\n".encode()
