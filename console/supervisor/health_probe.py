"""A child's health probe: ``/health`` answering 200, and for a router, the role it serves
without when it says it is degraded.

A ready child is not marked failing by one slow probe: the probe's deadline and the slow probes
in a row that count as failing follow its recent probe latencies (inference/health_rule.py, the
router's rule too). A refused connection (the process is gone or not serving) fails at once; a
dead process is seen sooner still, from its pid, by the supervisor's reaping."""

from __future__ import annotations

import time

import httpx

from inference.health_rule import ProbeRule

# The deadline of a probe of a child with no slow history, and at most how long a busy one's
# may grow to (its recent answers x 3).
PROBE_TIMEOUT_S = 0.5
PROBE_TIMEOUT_CAP_S = 1.5


def probe_health(http: httpx.Client, url: str, rule: ProbeRule | None = None,
                 ready: bool = False) -> tuple[bool, str]:
    """Whether ``url`` answers /health with 200, and the role a router serves without when
    it answers ``{"status": "degraded", "degraded": role}`` (still 200: it serves).

    With ``rule`` (the child's probe history), a ``ready`` child whose probe times out stays
    healthy until the rule says it has been slow too many times in a row; a starting child is
    healthy only when it answers."""
    timeout_s = rule.timeout_s(PROBE_TIMEOUT_S, PROBE_TIMEOUT_CAP_S) if rule else PROBE_TIMEOUT_S
    started = time.monotonic()
    try:
        response = http.get(f"{url}/health", timeout=timeout_s)
    except httpx.TimeoutException:
        # Slow, not gone (a connect timeout too: a loaded host accepts late).
        if rule is None:
            return False, ""
        down = rule.timed_out(PROBE_TIMEOUT_S)
        return ready and not down, ""
    except httpx.HTTPError:
        # Refused or reset: not answering is what the probe measures.
        if rule is not None:
            rule.refused()
        return False, ""
    if rule is not None:
        rule.answered(time.monotonic() - started)
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
