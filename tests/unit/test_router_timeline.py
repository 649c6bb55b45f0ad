"""The per-request timeline line and the prefill/decode pairing metric."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import pytest

from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]


def timelines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(record.getMessage().removeprefix("timeline "))
            for record in caplog.records if record.name == "pdserve.router.timeline"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_pd_request_logs_its_timeline_in_order(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture,
        stream: bool) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl")
    response = await running.client.post(
        "/v1/completions", headers={"X-Request-Id": "timeline-1"},
        json={"model": MODEL, "prompt": "hello world", "max_tokens": 4, "stream": stream})
    assert response.status == 200
    await response.read()

    [line] = timelines(caplog)
    assert line["request_id"] == "timeline-1"
    assert (line["prefill"], line["decode"]) == (prefill.url, decode.url)
    assert line["status"] == 200 and line["error"] is None
    order = ["received", "prefill_dispatched", "prefill_done", "decode_dispatched",
             "first_token", "last_token"]
    times = [line["events_ms"][event] for event in order]
    assert times == sorted(times)
    assert line["prompt_tokens"] > 0
    assert (line["stream_chunks"] > 1) if stream else (line["stream_chunks"] == 0)
    assert await running.metric("pdserve_router_kv_handoffs_total",
                                {"prefill": prefill.url, "decode": decode.url,
                                 "outcome": "ok"}) == 1


async def test_a_decode_dying_mid_stream_counts_a_failed_hand_off(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode.die_after_chunks = 2
    # Degraded mode off: no worker may continue the stream.
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 degraded_mode=False)
    response = await running.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "hello world", "max_tokens": 4, "stream": True})
    assert response.status == 200
    await response.read()
    [line] = timelines(caplog)
    assert "decode failed mid-stream" in line["error"]
    assert await running.metric("pdserve_router_kv_handoffs_total",
                                {"prefill": prefill.url, "decode": decode.url,
                                 "outcome": "failed"}) == 1


async def test_a_client_that_leaves_mid_stream_abandons_the_hand_off_not_fails_it(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl")
    decode.stream_gate = asyncio.Event()  # decode holds the rest of its stream
    response = await running.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "hello world", "max_tokens": 4, "stream": True})
    assert response.status == 200
    await response.content.readline()
    response.close()  # as a verification's streamed check does once it has read enough
    deadline = asyncio.get_running_loop().time() + 5
    while not timelines(caplog):
        assert asyncio.get_running_loop().time() < deadline, "no timeline after the client left"
        await asyncio.sleep(0.05)
    decode.stream_gate.set()
    [line] = timelines(caplog)
    assert (line["status"], line["error"]) == (499, "client disconnected")
    pair = {"prefill": prefill.url, "decode": decode.url}
    assert await running.metric("pdserve_router_kv_handoffs_total",
                                {**pair, "outcome": "abandoned"}) == 1
    assert await running.metric("pdserve_router_kv_handoffs_total",
                                {**pair, "outcome": "failed"}) == 0


async def test_a_prompt_within_one_block_goes_straight_to_decode(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage", local_prefill_max_tokens=4)
    short = await running.client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hello world", "max_tokens": 4})
    assert short.status == 200
    assert prefill.requests == [] and len(decode.requests) == 1
    assert "kv_transfer_params" not in decode.requests[0].body
    long = await running.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4})
    assert long.status == 200
    assert len(prefill.requests) == 1 and len(decode.requests) == 2
    assert await running.metric("pdserve_router_local_prefill_total", {}) == 1
    assert [line["kv"] for line in timelines(caplog)][0] == {"local_prefill": True}


async def test_a_handed_over_request_keeps_its_placement_beside_the_transfer(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl")
    response = await running.client.post(
        "/v1/completions", headers={"X-Pdserve-Placement": "remote"},
        json={"model": MODEL, "prompt": "hello world", "max_tokens": 4})
    assert response.status == 200
    [line] = timelines(caplog)
    assert line["kv"]["placement"] == "remote"
    assert line["kv"]["remote_engine_id"] == "stub-prefill-engine"
