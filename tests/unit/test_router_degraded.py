"""Degraded mode: while one role has no ready worker, the other serves whole requests (decode
computes prompts itself, or prefill runs the request end to end), counted by the missing role;
with the plan's switch off, such requests are answered 503 as before."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, as_client_sent, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

COMPLETION = {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "stream": True}
DEGRADED = "pdserve_router_degraded_total"
VLLM_500 = {"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError",
                      "param": None, "code": 500}}


@pytest.mark.parametrize("body", [COMPLETION, CHAT], ids=["completion", "chat-stream"])
async def test_with_no_prefill_ready_decode_computes_the_prompt(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str,
        body: dict[str, object]) -> None:
    decode = await make_stub("decode")
    running = await start_router(prefill=(dead_url,), decode=(decode.url,), wait_ready=False)
    await wait_until(lambda: bool(running.router.registry.primary.pools["decode"].ready())
                     and bool(running.router.registry.primary.pools["prefill"].backends[0].last_error))
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    response = await running.client.post(path, json=body)
    assert response.status == 200, await response.text()
    await response.read()
    # Decode got the client's own body: no transfer parameters, no prefill's token ids (a
    # stream asks for the answer's, see as_client_sent).
    assert [as_client_sent(r.body) for r in decode.requests] == [body]
    assert await running.metric(DEGRADED, {"missing_role": "prefill"}) == 1
    health = await running.client.get("/health")
    assert health.status == 200
    assert (await health.json())["status"] == "degraded"
    assert (await health.json())["degraded"] == "prefill"


async def test_with_no_decode_ready_prefill_runs_the_whole_request(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str) -> None:
    prefill = await make_stub("prefill")
    running = await start_router(prefill=(prefill.url,), decode=(dead_url,), wait_ready=False,
                                 kv_channel="nixl")
    await wait_until(lambda: bool(running.router.registry.primary.pools["prefill"].ready())
                     and bool(running.router.registry.primary.pools["decode"].backends[0].last_error))
    response = await running.client.post("/v1/chat/completions", json=CHAT)
    assert response.status == 200
    assert b"prefill-0" in await response.read()
    # The request as the client sent it: streamed, its own max_tokens, no KV hand-off asked.
    assert [as_client_sent(r.body) for r in prefill.requests] == [CHAT]
    assert await running.metric(DEGRADED, {"missing_role": "decode"}) == 1


async def test_every_prefill_failing_mid_request_falls_back_to_decode(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefills = [await make_stub("prefill-a"), await make_stub("prefill-b")]
    decode = await make_stub("decode")
    running = await start_router(prefill=tuple(p.url for p in prefills), decode=(decode.url,),
                                 kv_channel="nixl", health_interval_s=30.0)
    for stub in prefills:
        stub.fail_with = (500, VLLM_500)
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 200, await response.text()
    # One retry on the other prefill, then decode computes the prompt itself.
    assert [len(stub.requests) for stub in prefills] == [1, 1]
    assert [r.body for r in decode.requests] == [COMPLETION]
    assert await running.metric(DEGRADED, {"missing_role": "prefill"}) == 1


async def test_with_degraded_mode_off_a_missing_prefill_is_503(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str) -> None:
    decode = await make_stub("decode")
    running = await start_router(prefill=(dead_url,), decode=(decode.url,), wait_ready=False,
                                 degraded_mode=False)
    await wait_until(lambda: bool(running.router.registry.primary.pools["decode"].ready())
                     and bool(running.router.registry.primary.pools["prefill"].backends[0].last_error))
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.status == 503
    assert (await response.json())["error"]["code"] == "prefill_unavailable"
    assert decode.requests == []
    assert await running.metric(DEGRADED, {"missing_role": "prefill"}) == 0
    assert (await running.client.get("/health")).status == 503


@pytest.mark.parametrize("stream", [False, True])
async def test_a_decode_that_refuses_the_call_leaves_the_request_to_prefill(
        start_router: StartRouter, make_stub: MakeStub, stream: bool) -> None:
    # A long probe interval: the router still believes decode is up when the request comes,
    # so the request itself meets the refused connection, before any byte reached the client.
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 health_interval_s=30.0)
    await decode.close()
    body = {**COMPLETION, "stream": stream}
    response = await running.client.post("/v1/completions", json=body)
    assert response.status == 200, await response.text()
    assert b"prefill" in await response.read()
    # The hand-off's prefill call, then the whole request once decode refused.
    assert [r.body.get("max_tokens") for r in prefill.requests] == [1, 4]
    assert as_client_sent(prefill.requests[-1].body) == body
    assert await running.metric(DEGRADED, {"missing_role": "decode"}) == 1


async def test_a_decode_gone_while_the_request_prefilled_leaves_it_to_prefill(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    # Seen under `vllm bench serve` through a decode SIGKILL: requests whose prefill ended just
    # after decode left rotation found no decode to hand over to and were answered 503.
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    prefill.seconds_per_prompt_token = 0.15
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 health_interval_s=0.1)
    answer = asyncio.create_task(running.client.post("/v1/completions", json=COMPLETION))
    await wait_until(lambda: len(prefill.requests) == 1)
    await decode.close()
    await wait_until(lambda: not running.router.registry.primary.pools["decode"].ready())
    assert not answer.done(), "the prefill ended before decode left rotation"
    response = await answer
    assert response.status == 200, await response.text()
    assert b"prefill" in await response.read()
    # The hand-off's prefill call, then the whole request on prefill: never sent to decode.
    assert [r.body.get("max_tokens") for r in prefill.requests] == [1, 4]
    assert decode.requests == []
    assert await running.metric(DEGRADED, {"missing_role": "decode"}) == 1
