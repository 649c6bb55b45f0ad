"""Failover: a prefill that fails before any token is retried once on another prefill worker;
a call the worker never received (refused, connect timeout) is retried once, decode included; a
KV hand-off that decode cannot load ends in a clear error, not a hang.

Stub workers stand in for vLLM here because these are faults vLLM cannot be made to produce on
demand: a worker that resets the connection mid-answer, a 500 at a chosen moment, a port that
listens but never accepts, a decode that rejects the KV it was offered (real vLLM does that
after ~5 s for stale transfer params).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from inference.router.prompts import PromptChecker
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

COMPLETION = {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4}
RETRIES = "pdserve_router_retries_total"
VLLM_500 = {"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError",
                      "param": None, "code": 500}}
KV_LOAD_500 = {"error": {"message": "KV load failure for request cmpl-x-0",
                         "type": "InternalServerError", "param": None, "code": 500}}


async def break_worker(stub: StubVLLM, fault: str) -> None:
    if fault == "refused":
        await stub.close()
    elif fault == "http_500":
        stub.fail_with = (500, VLLM_500)
    elif fault == "reset_mid_body":
        stub.truncate_json_body = True
    else:
        raise AssertionError(fault)


async def two_prefills(start_router: StartRouter, make_stub: MakeStub,
                       **overrides: Any) -> tuple[RunningRouter, list[StubVLLM], StubVLLM]:
    prefills = [await make_stub("prefill-a"), await make_stub("prefill-b")]
    decode = await make_stub("decode")
    # A long probe interval: the router still believes a broken worker is up when the request
    # arrives, so the request itself meets the failure.
    running = await start_router(prefill=tuple(p.url for p in prefills), decode=(decode.url,),
                                 kv_channel="nixl", health_interval_s=30.0, **overrides)
    return running, prefills, decode


@pytest.mark.parametrize("fault", ["refused", "http_500", "reset_mid_body"])
async def test_a_failed_prefill_is_retried_once_on_another_worker(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture,
        fault: str) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    running, (first, second), decode = await two_prefills(start_router, make_stub)
    first_url = first.url  # a closed stub no longer knows its URL
    # least_outstanding with both idle starts with the first member.
    await break_worker(first, fault)
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 200, await response.text()
    assert (await response.json())["choices"][0]["text"] == "decode"
    assert len(second.requests) == 1
    [sent] = decode.requests
    assert sent.body["kv_transfer_params"]["remote_engine_id"] == "stub-prefill-engine"
    assert await running.metric(RETRIES, {"role": "prefill"}) == 1
    [line] = [json.loads(r.getMessage().removeprefix("timeline ")) for r in caplog.records
              if r.name == "pdserve.router.timeline"]
    assert (line["retried_from"], line["prefill"]) == (first_url, second.url)
    assert line["events_ms"]["prefill_dispatched"] <= line["events_ms"]["prefill_retried"]
    # A refused or broken connection takes the worker out at once; a 500 says nothing about
    # whether the next request would work there, so it stays in.
    [member] = [b for b in running.router.registry.primary.pools["prefill"].backends if b.url == first_url]
    assert member.healthy is (fault == "http_500")


async def test_both_prefills_failing_is_503_naming_prefill_and_both_workers(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefills, decode = await two_prefills(start_router, make_stub,
                                                degraded_mode=False)
    for stub in prefills:
        stub.fail_with = (500, VLLM_500)
    started = time.monotonic()
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert time.monotonic() - started < 3
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "prefill_unavailable"
    assert "prefill" in error["message"] and "EngineCore encountered an issue" in error["message"]
    assert all(stub.url in error["message"] for stub in prefills)
    # Exactly one retry, never a loop; decode never sees a request without its KV.
    assert [len(stub.requests) for stub in prefills] == [1, 1]
    assert decode.requests == []
    assert await running.metric(RETRIES, {"role": "prefill"}) == 1


async def test_a_lone_failing_prefill_is_503_saying_there_is_no_other(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 degraded_mode=False)
    prefill.fail_with = (502, {"detail": "bad gateway"})
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "prefill_unavailable"
    assert prefill.url in error["message"] and "no other ready prefill worker" in error["message"]
    assert "bad gateway" in error["message"]
    assert await running.metric(RETRIES, {"role": "prefill"}) == 0


async def test_a_client_error_from_prefill_is_not_retried(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, (first, second), decode = await two_prefills(start_router, make_stub)
    vllm_400 = {"error": {"message": "bad temperature", "type": "BadRequestError", "param": None,
                          "code": 400}}
    first.fail_with = (400, vllm_400)
    response = await running.client.post("/v1/completions", json=COMPLETION)
    # The same request would be refused anywhere: relay the worker's answer as it is.
    assert response.status == 400
    assert await response.json() == vllm_400
    assert second.requests == [] and decode.requests == []
    assert await running.metric(RETRIES, {"role": "prefill"}) == 0


@dataclass
class SlowStub(StubVLLM):
    """Answers every inference request only after ``delay_s`` (vLLM's KV load timeout is ~5 s),
    or, with ``hold``, once the test sets it."""

    delay_s: float = 0.0
    hold: asyncio.Event | None = None

    async def _inference(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(self.delay_s)
        if self.hold is not None:
            await self.hold.wait()
        return await super()._inference(request)


@pytest_asyncio.fixture(loop_scope="function")
async def make_slow_stub(make_checker: Callable[..., PromptChecker]) -> AsyncIterator[
        Callable[[str], Awaitable[SlowStub]]]:
    stubs: list[SlowStub] = []

    async def make(name: str) -> SlowStub:
        stub = SlowStub(name=name, tokenizer=make_checker().tokenizer)
        await stub.start()
        stubs.append(stub)
        return stub

    yield make
    for stub in stubs:
        if stub.hold is not None:
            stub.hold.set()
        await stub.close()


@pytest.mark.parametrize("kv_channel", ["nixl", "shared-storage"])
@pytest.mark.parametrize("stream", [False, True])
async def test_decode_failing_to_load_the_kv_is_a_clear_error_naming_the_hand_off(
        start_router: StartRouter, make_stub: MakeStub,
        make_slow_stub: Callable[[str], Awaitable[SlowStub]], kv_channel: str, stream: bool) -> None:
    prefill = await make_stub("prefill")
    decode = await make_slow_stub("decode")
    decode.delay_s = 0.3
    decode.fail_with = (500, KV_LOAD_500)
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel=kv_channel)
    started = time.monotonic()
    response = await running.client.post("/v1/completions", json={**COMPLETION, "stream": stream})
    assert time.monotonic() - started < 3
    # JSON, not an event stream: decode failed before its first byte, so the status can say so.
    assert response.status == 502
    assert response.content_type == "application/json"
    error = (await response.json())["error"]
    assert error["code"] == "kv_handoff_failed"
    assert error["type"] == "InternalServerError"
    for part in ("KV hand-off failed", decode.url, prefill.url, "KV load failure for request"):
        assert part in error["message"]
    assert await running.metric("pdserve_router_kv_handoffs_total",
                                {"prefill": prefill.url, "decode": decode.url, "outcome": "failed"}) == 1
    assert await running.metric("pdserve_router_backend_errors_total",
                                {"role": "decode", "kind": "kv_handoff"}) == 1
    # vLLM stays healthy after a failed KV load; so does the router's view of it.
    assert running.router.registry.primary.pools["decode"].ready()


async def test_a_decode_500_without_a_hand_off_is_relayed_as_it_is(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode.fail_with = (500, VLLM_500)
    # A prompt within one block is computed by decode itself: no KV was handed over, so the
    # error must not be blamed on a hand-off.
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), local_prefill_max_tokens=32)
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 500
    assert await response.json() == VLLM_500
    assert prefill.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_a_decode_that_never_answers_ends_at_the_request_timeout(
        start_router: StartRouter, make_stub: MakeStub,
        make_slow_stub: Callable[[str], Awaitable[SlowStub]], stream: bool) -> None:
    prefill = await make_stub("prefill")
    decode = await make_slow_stub("decode")
    decode.hold = asyncio.Event()
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 request_timeout_s=0.5)
    started = time.monotonic()
    response = await running.client.post("/v1/completions", json={**COMPLETION, "stream": stream})
    assert time.monotonic() - started < 3
    assert response.status == 504
    error = (await response.json())["error"]
    assert error["code"] == "request_timeout"
    assert decode.url in error["message"] and "timed out after 0.5 s" in error["message"]


async def test_prefill_and_decode_share_one_overall_timeout(
        start_router: StartRouter, make_slow_stub: Callable[[str], Awaitable[SlowStub]]) -> None:
    # Each call alone fits the timeout; together they do not, and the request must end at
    # the one overall budget, not at one budget per call.
    prefill = await make_slow_stub("prefill")
    prefill.delay_s = 0.6
    decode = await make_slow_stub("decode")
    decode.delay_s = 0.6
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 request_timeout_s=1.0)
    started = time.monotonic()
    response = await running.client.post("/v1/completions", json=COMPLETION)
    elapsed = time.monotonic() - started
    assert response.status == 504
    assert (await response.json())["error"]["code"] == "request_timeout"
    assert 0.9 < elapsed < 1.15


async def test_the_breaker_takes_out_a_worker_whose_calls_fail_while_its_health_passes(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    broken = await make_stub("broken")
    broken.fail_with = (500, VLLM_500)
    healthy = await make_stub("healthy")
    running = await start_router(colocated=(broken.url, healthy.url), colocated_policy="round_robin",
                                 breaker_failures=3, breaker_cooldown_s=1.0)
    statuses = []
    for _ in range(10):
        response = await running.client.post("/v1/completions", json=COMPLETION)
        statuses.append(response.status)
    # Round robin: the broken worker's three failures open its breaker; after that, all
    # requests go to the healthy one even though the broken one's /health passes.
    assert len(broken.requests) == 3
    assert statuses.count(200) == 7
    assert await running.metric("pdserve_router_breaker_opened_total",
                                {"role": "colocated", "backend": broken.url}) == 1
    [member] = [b for b in running.router.registry.primary.pools["colocated"].backends if b.url == broken.url]
    assert not member.healthy and "circuit open" in member.last_error
    # After the cool-down its probe puts it back (half-open), and one more failure reopens it.
    await wait_until(lambda: member.healthy, timeout_s=3)
    await running.client.post("/v1/completions", json=COMPLETION)
    await running.client.post("/v1/completions", json=COMPLETION)
    assert len(broken.requests) == 4 and not member.healthy


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["pd", "colocated"])
async def test_a_worker_the_request_never_reached_is_passed_over_for_another(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture,
        mode: str, stream: bool) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    first, second = await make_stub("first"), await make_stub("second")
    first_url = first.url
    role = "decode" if mode == "pd" else "colocated"
    if mode == "pd":
        prefill = await make_stub("prefill")
        running = await start_router(prefill=(prefill.url,), decode=(first_url, second.url),
                                     kv_channel="nixl", health_interval_s=30.0)
    else:
        running = await start_router(colocated=(first_url, second.url), health_interval_s=30.0)
    await first.close()  # refused from now on; the router has not probed since
    response = await running.client.post("/v1/completions", json={**COMPLETION, "stream": stream})
    assert response.status == 200, await response.text()
    body = await response.text()
    assert "second" in body and "error" not in body
    assert len(second.requests) == 1
    if mode == "pd":
        # One prefill: its KV lease still holds, and the second decode is offered the same KV.
        assert len(prefill.requests) == 1
        assert second.requests[0].body["kv_transfer_params"]["remote_engine_id"] == "stub-prefill-engine"
    assert await running.metric(RETRIES, {"role": role}) == 1
    assert not running.router.registry.primary.pools[role].backends[0].healthy
    [line] = [json.loads(r.getMessage().removeprefix("timeline ")) for r in caplog.records
              if r.name == "pdserve.router.timeline"]
    assert line["retried_from"] == first_url and line["status"] == 200
    assert line["events_ms"]["decode_dispatched"] <= line["events_ms"][f"{role}_retried"]


async def test_a_lone_worker_that_refuses_is_503_without_a_retry(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode_url = decode.url
    running = await start_router(prefill=(prefill.url,), decode=(decode_url,),
                                 kv_channel="nixl", health_interval_s=30.0, degraded_mode=False)
    await decode.close()
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "decode_unavailable" and decode_url in error["message"]
    assert await running.metric(RETRIES, {"role": "decode"}) == 0


def unaccepting_listener(port: int) -> list[socket.socket]:
    """A socket on ``port`` that listens but never accepts, its queue filled, so that a new
    connection times out instead of being refused: a host too loaded to answer a SYN. Not
    something vLLM can be made to do on demand."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(0)
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.1)
    return [listener, *fillers]


@pytest.mark.parametrize("role", ["prefill", "decode"])
async def test_a_connect_timeout_on_a_lone_worker_still_up_is_tried_once_more_on_it(
        start_router: StartRouter, make_stub: MakeStub, role: str) -> None:
    stubs = {"prefill": await make_stub("prefill"), "decode": await make_stub("decode")}
    running = await start_router(prefill=(stubs["prefill"].url,), decode=(stubs["decode"].url,),
                                 kv_channel="nixl", health_interval_s=30.0, connect_timeout_s=0.3,
                                 degraded_mode=False)
    stalled = stubs[role]
    url = stalled.url
    port = stalled.server.port if stalled.server is not None else 0
    await stalled.close()
    sockets = unaccepting_listener(port)
    try:
        started = time.monotonic()
        response = await running.client.post("/v1/completions", json=COMPLETION)
        elapsed = time.monotonic() - started
    finally:
        for sock in sockets:
            sock.close()
    assert response.status == 503, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == f"{role}_unavailable"
    assert url in error["message"] and "timed out" in error["message"]
    # Two connect timeouts, not one and not the request's 10 s budget.
    assert 0.6 <= elapsed < 3
    assert await running.metric(RETRIES, {"role": role}) == 1
    # A connect timeout alone does not take the worker out: the probe decides that.
    assert running.router.registry.primary.pools[role].backends[0].healthy
