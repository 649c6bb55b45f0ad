"""A child's health probe: ``/health`` answering 200, and for a router, the role it serves
without when it says it is degraded."""

from __future__ import annotations

import httpx


def probe_health(http: httpx.Client, url: str) -> tuple[bool, str]:
    """Whether ``url`` answers /health with 200, and the role a router serves without when
    it answers ``{"status": "degraded", "degraded": role}`` (still 200: it serves)."""
    try:
        response = http.get(f"{url}/health")
    except httpx.HTTPError:
        # Not answering is what the probe measures: the state machine records it.
        return False, ""
    if response.status_code != 200:
        return False, ""
    return True, _degraded_role(response)


def _degraded_role(response: httpx.Response) -> str:
    # vLLM answers /health with an empty body; only the router's is JSON.
    if "json" not in response.headers.get("content-type", ""):
        return ""
    try:
        answer = response.json()
    except ValueError:
        # A body that is not JSON says nothing about degradation; 200 says it is healthy.
        return ""
    if not isinstance(answer, dict) or answer.get("status") != "degraded":
        return ""
    return str(answer.get("degraded") or "")[:20]
