"""The prefill/decode hand-off protocol, checked against stub workers that emulate vLLM's
OpenAI server (see ``StubVLLM`` in conftest): what each hop receives, how the KV hand-off
degrades safely, streaming pass-through, and how dead workers surface to the client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from inference.router.handoff import NIXL_PREFILL_PARAMS
from tests.unit.conftest import (
    MODEL,
    STUB_NIXL_RESPONSE_PARAMS,
    RunningRouter,
    StubVLLM,
    as_client_sent,
    wait_until,
)

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "system", "content": "you are a helpful model"},
            {"role": "user", "content": "tell me a story"}]
FALLBACK = "pdserve_router_pd_fallback_total"


async def pd_router(start_router: StartRouter, make_stub: MakeStub, kv_channel: str,
                    **overrides: Any) -> tuple[RunningRouter, StubVLLM, StubVLLM]:
    prefill = await make_stub("prefill")
    decode = await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel=kv_channel,
                                 **overrides)
    return running, prefill, decode


def request_body(path: str, **extra: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, **extra}
    return {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 8, **extra}


def sse_events(raw: bytes) -> list[str]:
    return [part.removeprefix("data: ") for part in raw.decode().split("\n\n") if part]


@pytest.mark.parametrize("kv_channel", ["nixl", "shared-storage"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_prefill_request_is_a_one_token_non_streamed_run(
        start_router: StartRouter, make_stub: MakeStub, kv_channel: str, path: str) -> None:
    running, prefill, _decode = await pd_router(start_router, make_stub, kv_channel)
    body = request_body(path, stream=True, stream_options={"include_usage": True}, min_tokens=4,
                        temperature=0.3)
    response = await running.client.post(path, json=body)
    assert response.status == 200, await response.text()
    await response.read()

    [sent] = prefill.requests
    assert sent.path == path
    assert sent.body["max_tokens"] == 1
    assert sent.body["stream"] is False
    assert sent.body["return_token_ids"] is True
    # vLLM rejects stream_options without stream, and min_tokens > max_tokens.
    assert "stream_options" not in sent.body
    assert "min_tokens" not in sent.body
    # Sampling settings are left alone; only the length of the run changes.
    assert sent.body["temperature"] == 0.3
    if path == CHAT:
        assert sent.body["messages"] == MESSAGES
        assert sent.body["max_completion_tokens"] == 1
    else:
        assert sent.body["prompt"] == body["prompt"]
    if kv_channel == "nixl":
        assert sent.body["kv_transfer_params"] == NIXL_PREFILL_PARAMS
        assert sent.body["kv_transfer_params"]["do_remote_decode"] is True
    else:
        assert "kv_transfer_params" not in sent.body


async def test_chat_decode_gets_prefill_kv_transfer_params_when_tokens_match(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl")
    body = request_body(CHAT, stream=True, stream_options={"include_usage": True})
    response = await running.client.post(CHAT, json=body)
    assert response.status == 200, await response.text()
    await response.read()

    [sent] = decode.requests
    assert sent.body["kv_transfer_params"] == STUB_NIXL_RESPONSE_PARAMS
    # Apart from the hand-off, decode runs the client's request as sent, asked for the
    # answer's token ids too: what a migration after a decode failure needs.
    assert sent.body["return_token_ids"] is True
    assert {k: v for k, v in sent.body.items()
            if k not in ("kv_transfer_params", "return_token_ids")} == body
    assert await running.metric(FALLBACK, {"reason": "token_mismatch"}) == 0


@pytest.mark.parametrize("kv_channel", ["nixl", "shared-storage"])
async def test_completions_decode_prompt_is_prefill_prompt_token_ids(
        start_router: StartRouter, make_stub: MakeStub, kv_channel: str) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, kv_channel)
    # Ids the router could not have produced itself, so the test shows decode got prefill's.
    prefill.prompt_token_ids_override = [9, 8, 7, 6, 5]
    response = await running.client.post(COMPLETIONS, json=request_body(COMPLETIONS))
    assert response.status == 200, await response.text()
    assert (await response.json())["choices"][0]["text"] == "decode"

    [sent] = decode.requests
    assert sent.body["prompt"] == [9, 8, 7, 6, 5]
    assert sent.body["max_tokens"] == 8
    if kv_channel == "nixl":
        assert sent.body["kv_transfer_params"] == STUB_NIXL_RESPONSE_PARAMS
    else:
        assert "kv_transfer_params" not in sent.body


async def test_chat_token_mismatch_falls_back_to_decode_recomputing(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl")
    own_ids = running.router.checker.parse("chat", request_body(CHAT)).prompt_token_ids
    # Prefill rendered one token more than the router did (e.g. a different chat template).
    prefill.prompt_token_ids_override = [*own_ids, 1]
    before = await running.metric(FALLBACK, {"reason": "token_mismatch"})

    response = await running.client.post(CHAT, json=request_body(CHAT))
    assert response.status == 200, await response.text()

    [sent] = decode.requests
    assert "kv_transfer_params" not in sent.body
    assert sent.body == request_body(CHAT)
    assert await running.metric(FALLBACK, {"reason": "token_mismatch"}) == before + 1


@pytest.mark.parametrize(
    ("knob", "reason"),
    [("omit_kv_transfer_params", "no_kv_params"), ("omit_prompt_token_ids", "no_prompt_token_ids")],
)
async def test_prefill_answer_missing_hand_off_data_falls_back(
        start_router: StartRouter, make_stub: MakeStub, knob: str, reason: str) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl")
    setattr(prefill, knob, True)
    response = await running.client.post(CHAT, json=request_body(CHAT))
    assert response.status == 200, await response.text()
    [sent] = decode.requests
    assert sent.body == request_body(CHAT)
    assert await running.metric(FALLBACK, {"reason": reason}) == 1


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_streamed_chunks_pass_through_unchanged_and_in_order(
        start_router: StartRouter, make_stub: MakeStub, path: str) -> None:
    running, _prefill, decode = await pd_router(start_router, make_stub, "nixl")
    decode.stream_chunks = 12
    response = await running.client.post(path, json=request_body(path, stream=True))
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    endpoint = "chat" if path == CHAT else "completions"
    assert await response.read() == b"".join(decode.sse_chunks(endpoint))


async def test_streamed_chunks_reach_the_client_before_the_stream_ends(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd_router(start_router, make_stub, "shared-storage")
    # The decode stub holds the stream open after its first chunk; a router that buffered
    # the response would deliver nothing until the gate opens, and the read would time out.
    decode.stream_gate = asyncio.Event()
    response = await running.client.post(CHAT, json=request_body(CHAT, stream=True))
    assert response.status == 200
    chunks = decode.sse_chunks("chat")
    first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=3)
    assert first == chunks[0]
    decode.stream_gate.set()
    assert await response.read() == b"".join(chunks[1:])


async def test_decode_dying_mid_stream_with_nowhere_to_go_on_ends_with_an_sse_error_event(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    # No other decode, and degraded mode off: no worker may continue the stream (with one,
    # it goes on, see test_router_migration.py).
    running, _prefill, decode = await pd_router(start_router, make_stub, "nixl",
                                                degraded_mode=False)
    decode.die_after_chunks = 3
    started = time.monotonic()
    response = await running.client.post(CHAT, json=request_body(CHAT, stream=True))
    assert response.status == 200
    raw = await response.read()
    assert time.monotonic() - started < 5

    chunks = decode.sse_chunks("chat")
    assert raw.startswith(b"".join(chunks[:3]))
    events = sse_events(raw)
    assert len(events) == 4
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == "decode_failed"
    assert "decode" in error["message"]
    assert decode.url in error["message"]
    assert "no other ready worker" in error["message"]
    labels = {"role": "decode", "kind": "ClientPayloadError"}
    assert await running.metric("pdserve_router_backend_errors_total", labels) == 1


async def test_decode_dying_mid_body_of_a_non_streamed_answer_is_503_naming_decode(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd_router(start_router, make_stub, "nixl",
                                                degraded_mode=False)
    decode.truncate_json_body = True
    response = await running.client.post(CHAT, json=request_body(CHAT))
    assert response.status == 503, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "decode_unavailable"
    assert "decode" in error["message"]


async def test_prefill_dying_mid_body_is_503_naming_prefill(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl", degraded_mode=False)
    prefill.truncate_json_body = True
    response = await running.client.post(COMPLETIONS, json=request_body(COMPLETIONS))
    assert response.status == 503, await response.text()
    assert (await response.json())["error"]["code"] == "prefill_unavailable"
    assert decode.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_decode_port_closed_is_503_naming_decode_quickly(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str, stream: bool) -> None:
    prefill = await make_stub("prefill")
    running = await start_router(prefill=(prefill.url,), decode=(dead_url,), wait_ready=False,
                                 degraded_mode=False)
    await wait_until(lambda: bool(running.router.registry.primary.pools["prefill"].ready()))
    started = time.monotonic()
    response = await running.client.post(CHAT, json=request_body(CHAT, stream=stream))
    assert time.monotonic() - started < 3
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "decode_unavailable"
    assert "decode" in error["message"]
    # Prefilling for a decode pool that cannot take the request would only pin KV blocks on
    # the prefill worker until they time out.
    assert prefill.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_decode_that_went_down_after_its_probe_is_503_naming_decode(
        start_router: StartRouter, make_stub: MakeStub, stream: bool) -> None:
    # A long probe interval: the router still believes decode is up when the request arrives,
    # so this exercises the connection-error path rather than the "no ready worker" path.
    running, _prefill, decode = await pd_router(start_router, make_stub, "nixl",
                                                health_interval_s=30.0, degraded_mode=False)
    await decode.close()
    started = time.monotonic()
    response = await running.client.post(CHAT, json=request_body(CHAT, stream=stream))
    assert time.monotonic() - started < 3
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "decode_unavailable"
    assert "decode" in error["message"]
    # Passive health: the router stops routing to it without waiting 30 s for the next probe.
    health = await running.client.get("/health")
    assert health.status == 503
    assert (await health.json())["roles"]["decode"]["ready"] == 0


async def test_prefill_port_closed_is_503_naming_prefill(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str) -> None:
    decode = await make_stub("decode")
    running = await start_router(prefill=(dead_url,), decode=(decode.url,), wait_ready=False,
                                 degraded_mode=False)
    await wait_until(lambda: bool(running.router.registry.primary.pools["decode"].ready()))
    started = time.monotonic()
    response = await running.client.post(COMPLETIONS, json=request_body(COMPLETIONS))
    assert time.monotonic() - started < 3
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "prefill_unavailable"
    assert "prefill" in error["message"]
    assert decode.requests == []


async def test_prefill_that_went_down_after_its_probe_is_503_naming_prefill(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl",
                                               health_interval_s=30.0, degraded_mode=False)
    await prefill.close()
    response = await running.client.post(CHAT, json=request_body(CHAT))
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "prefill_unavailable"
    assert "prefill" in error["message"]
    assert decode.requests == []


VLLM_400 = {"error": {"message": "temperature must be non-negative, got -1.0",
                      "type": "BadRequestError", "param": None, "code": 400}}


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_400_from_prefill_is_relayed_unchanged(
        start_router: StartRouter, make_stub: MakeStub, stream: bool) -> None:
    running, prefill, decode = await pd_router(start_router, make_stub, "nixl")
    prefill.fail_with = (400, VLLM_400)
    response = await running.client.post(
        CHAT, json=request_body(CHAT, temperature=-1.0, stream=stream),
        headers={"X-Request-Id": "req-400"})
    assert response.status == 400
    assert response.content_type == "application/json"
    # Byte for byte what the stub sent (aiohttp's json_response serializes with json.dumps).
    assert await response.read() == json.dumps(VLLM_400).encode()
    assert response.headers["X-Request-Id"] == "req-400"
    assert decode.requests == []
    # A client error says nothing about the worker's health.
    assert running.router.registry.primary.pools["prefill"].ready()


@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_400_from_decode_is_relayed_unchanged(
        start_router: StartRouter, make_stub: MakeStub, stream: bool) -> None:
    running, _prefill, decode = await pd_router(start_router, make_stub, "shared-storage")
    decode.fail_with = (400, VLLM_400)
    response = await running.client.post(CHAT, json=request_body(CHAT, stream=stream))
    assert response.status == 400
    assert await response.json() == VLLM_400


@pytest.mark.parametrize("stream", [False, True])
async def test_colocated_mode_forwards_straight_to_the_colocated_pool(
        start_router: StartRouter, make_stub: MakeStub, stream: bool) -> None:
    worker = await make_stub("full")
    running = await start_router(colocated=(worker.url,))
    body = request_body(COMPLETIONS, stream=stream)
    response = await running.client.post(COMPLETIONS, json=body,
                                         headers={"X-Request-Id": "req-colo"})
    assert response.status == 200
    raw = await response.read()
    if stream:
        assert raw == b"".join(worker.sse_chunks("completions"))
    else:
        assert json.loads(raw)["choices"][0]["text"] == "full"
    # One hop, with the client's body untouched: no one-token run, no hand-off fields (a
    # stream asks for the answer's token ids, see as_client_sent).
    [sent] = worker.requests
    assert as_client_sent(sent.body) == body
    assert sent.headers["X-Request-Id"] == "req-colo"
    health = await running.client.get("/health")
    assert health.status == 200
    assert set((await health.json())["roles"]) == {"colocated"}


async def test_requests_alternate_between_idle_decode_workers(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill = await make_stub("prefill")
    decodes = [await make_stub("decode-a"), await make_stub("decode-b")]
    running = await start_router(prefill=(prefill.url,), decode=tuple(d.url for d in decodes))
    for _ in range(4):
        response = await running.client.post(CHAT, json=request_body(CHAT))
        assert response.status == 200
    assert [len(d.requests) for d in decodes] == [2, 2]


def _gauge(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"{name}{{"))


async def test_prompt_tokens_in_prefill_are_the_backlog_gauge_until_prefill_answers(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    """What a prefill autoscaler sizes the pool on: the prompt tokens sent to prefill and not
    computed yet, back to 0 once prefill has answered (and whatever decode does after)."""
    running, prefill, _decode = await pd_router(start_router, make_stub, "shared-storage")
    prefill.seconds_per_prompt_token = 0.05
    body = request_body(COMPLETIONS)
    tokens = len(prefill._prompt_ids("completions", body))
    calls = [asyncio.create_task(running.client.post(COMPLETIONS, json=body)) for _ in range(3)]
    await wait_until(lambda: prefill.active == 3)
    metrics = await (await running.client.get("/metrics")).text()
    assert _gauge(metrics, "pdserve_router_prefill_tokens_in_flight") == 3 * tokens
    for response in await asyncio.gather(*calls):
        assert response.status == 200, await response.text()
    metrics = await (await running.client.get("/metrics")).text()
    assert _gauge(metrics, "pdserve_router_prefill_tokens_in_flight") == 0
