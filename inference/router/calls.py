"""One call to one worker: picking it, the request's remaining time budget, the JSON call that
prefill makes, and what a failed call tells its worker (passive health, the circuit breaker in
backends.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from inference.router.backends import Backend, Pool
from inference.router.config import RouterConfig
from inference.router.errors import error_response
from inference.router.metrics import RouterMetrics
from inference.router.prompts import ParsedRequest
from inference.router.timeline import Timeline
from inference.router.upstream import (
    BackendFailure,
    RequestTimedOut,
    UpstreamError,
    describe,
    never_sent,
    ran_out_of_time,
    relay,
    upstream_message,
    worth_another_try,
)


class WorkerCalls:
    """The calls of one revision group (see groups.py): its pools, and its label on metrics."""

    def __init__(self, config: RouterConfig, pools: dict[str, Pool], metrics: RouterMetrics,
                 revision: str):
        self.config = config
        self.pools = pools
        self.metrics = metrics
        self.revision = revision

    def pick(self, role: str, parsed: ParsedRequest, exclude: Backend | None = None) -> Backend:
        pool = self.pools[role]
        choice = pool.pick(parsed.prompt_token_ids if pool.policy.uses_prompt else (), exclude)
        self.metrics.decision(role, pool.policy.name, choice.outcome)
        return choice.backend

    def budget(self, timeline: Timeline) -> aiohttp.ClientTimeout:
        """What is left of the request's overall timeout, for the next backend call: a PD
        request makes two calls (three with a retry), and all of them share one budget."""
        remaining = self.config.request_timeout_s - timeline.since_arrival()
        if remaining <= 0:
            raise RequestTimedOut()
        return aiohttp.ClientTimeout(total=remaining, sock_connect=self.config.connect_timeout_s)

    @contextlib.asynccontextmanager
    async def post(self, backend: Backend, path: str, timeline: Timeline, *, retriable: bool,
                   method: str = "POST", **request: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST to ``backend`` within what is left of the request's budget, counted in flight
        while it lasts. A connection-level failure, whenever it happens inside the block,
        tells passive health and becomes BackendFailure (``retriable`` if nothing reached the
        client and the failure is worth another try)."""
        timeout = self.budget(timeline)
        backend.acquire()
        try:
            async with backend.client().request(method, path, timeout=timeout,
                                                **request) as upstream:
                yield upstream
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            # ClientPayloadError: the worker died mid-body; not a ClientConnectionError subclass.
            self.backend_failed(backend, exc)
            raise BackendFailure(backend.role, backend, describe(exc),
                                 retriable=retriable and worth_another_try(exc),
                                 timed_out=ran_out_of_time(exc), unsent=never_sent(exc)) from exc
        finally:
            backend.release()

    async def call_json(self, backend: Backend, path: str, body: dict[str, Any],
                        timeline: Timeline) -> dict[str, Any]:
        """A call whose whole answer the router reads (prefill): its JSON object, or
        BackendFailure (retriable) for a 5xx, or UpstreamError carrying the answer to relay."""
        request_id = timeline.request_id
        async with self.post(backend, path, timeline, retriable=True, json=body,
                             headers={"X-Request-Id": request_id}) as upstream:
            payload = await upstream.read()
            if upstream.status >= 500:
                # A server error before any token (a crashed engine, an internal error):
                # worth trying on another worker; the worker itself may well be healthy.
                self.metrics.backend_errors.labels(backend.role, f"http_{upstream.status}",
                                                   self.revision).inc()
                backend.call_failed()
                raise BackendFailure(backend.role, backend,
                                     f"answered {upstream.status}: {upstream_message(payload)}",
                                     retriable=True)
            if upstream.status != 200:
                raise UpstreamError(relay(upstream.status, payload, upstream, request_id))
            try:
                data = json.loads(payload)
            except ValueError:
                data = None
            if not isinstance(data, dict):
                raise UpstreamError(error_response(
                    502, f"{backend.role} worker {backend.url} answered 200 without a JSON "
                    "object", request_id, code=f"{backend.role}_bad_response"))
            backend.call_succeeded()
            return data

    def backend_failed(self, backend: Backend, exc: BaseException) -> None:
        self.metrics.backend_errors.labels(backend.role, type(exc).__name__, self.revision).inc()
        if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                            aiohttp.ClientPayloadError)):
            # Passive health: stop sending to it now; the probe puts it back when it answers.
            # Timeouts are not failed calls: a slow worker is the probe's business, and a
            # request may run out of its own budget on a healthy worker.
            backend.mark(False, describe(exc))
            backend.call_failed()
