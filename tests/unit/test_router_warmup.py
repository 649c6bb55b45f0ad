"""The NIXL warm-up: one synthetic hand-off per prefill/decode pair before the router reports
itself healthy, retried while it fails, done again for a worker that comes back.

Stub workers stand in for vLLM: what is tested is the router's part (which calls, in which
order, with which transfer parameters, and what /health says meanwhile). The real handshake
is exercised by tests/nodes/test_two_nodes.py, whose router has the warm-up on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from inference.router.config import RouterConfig
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]
KV_LOAD_500 = {"error": {"message": "KV load failure for request cmpl-warm-0",
                         "type": "InternalServerError", "param": None, "code": 500}}
TOKENS = 40


async def health(running: RunningRouter) -> tuple[int, dict]:
    response = await running.client.get("/health")
    return response.status, await response.json()


async def test_every_pair_is_handed_off_once_before_the_router_is_healthy(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefills = [await make_stub("prefill-a"), await make_stub("prefill-b")]
    decode = await make_stub("decode")
    running = await start_router(prefill=tuple(p.url for p in prefills), decode=(decode.url,),
                                 kv_channel="nixl", kv_warmup_tokens=TOKENS, max_model_len=64)
    warmer = running.router.registry.primary.warmer
    await wait_until(lambda: warmer is not None and len(warmer.pairs) == 2
                     and all(p.state == "warm" for p in warmer.pairs.values()))
    status, body = await health(running)
    assert status == 200 and body["status"] == "ok"
    assert sorted((p["prefill"], p["state"]) for p in body["kv_warmup"]) == sorted(
        (p.url, "warm") for p in prefills)
    # Each prefill: one prompt of TOKENS ids, one token out, asking to keep its KV for decode.
    for prefill in prefills:
        [sent] = prefill.requests
        assert len(sent.body["prompt"]) == TOKENS and sent.body["max_tokens"] == 1
        assert sent.body["kv_transfer_params"]["do_remote_decode"] is True
    # Decode: the same ids, with the transfer parameters prefill answered.
    assert len(decode.requests) == 2
    for sent in decode.requests:
        assert sent.body["kv_transfer_params"]["remote_engine_id"] == "stub-prefill-engine"
    assert {tuple(d.body["prompt"]) for d in decode.requests} == {
        tuple(p.requests[0].body["prompt"]) for p in prefills}
    # Two pairs, two different first tokens: decode's prefix cache cannot answer the second.
    assert len({d.body["prompt"][0] for d in decode.requests}) == 2


async def test_a_failing_hand_off_keeps_the_router_unhealthy_and_is_retried(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode.fail_with = (500, KV_LOAD_500)
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 kv_warmup_tokens=TOKENS, max_model_len=64, wait_ready=False)
    assert running.router.registry.primary.warmer is not None
    running.router.registry.primary.warmer.retry_s = 0.05
    await wait_until(lambda: len(decode.requests) >= 2)
    status, body = await health(running)
    assert status == 503 and body["status"] == "unavailable"
    [pair] = body["kv_warmup"]
    assert pair["state"] == "failed" and pair["attempts"] >= 2
    assert "answered 500" in pair["error"] and "KV load failure" in pair["error"]
    # Both roles have a ready worker: only the warm-up holds the router back.
    assert all(role["ready"] == 1 for role in body["roles"].values())

    decode.fail_with = None
    await wait_until(lambda: running.router.registry.primary.warmer.any_warm())
    status, body = await health(running)
    assert status == 200 and body["kv_warmup"][0]["state"] == "warm"


async def test_a_worker_that_went_down_is_warmed_again_when_it_is_back(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    # One probe at start, then none for 30 s: the test plays the probe's part below, and a
    # real probe in between would put the worker back before the warmer saw it gone.
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl",
                                 kv_warmup_tokens=TOKENS, max_model_len=64,
                                 health_interval_s=30.0)
    warmer = running.router.registry.primary.warmer
    assert warmer is not None
    warmer.retry_s = 0.05
    await wait_until(warmer.any_warm)
    backend = running.router.registry.primary.pools["decode"].backends[0]
    backend.mark(False, "probe failed")  # what the health probe does for a dead worker
    await wait_until(lambda: not warmer.pairs)
    backend.mark(True)
    await wait_until(warmer.any_warm)
    assert len(decode.requests) == 2 and len(prefill.requests) == 2


@pytest.mark.parametrize(("overrides", "flag_message"), [
    ({"kv_warmup_tokens": 64}, "--kv-warmup-tokens: must be 0 (off) or from 1 to"),
    ({"kv_warmup_tokens": -1}, "--kv-warmup-tokens: must be 0 (off) or from 1 to"),
    ({"kv_warmup_tokens": 8, "kv_channel": "shared-storage"}, "needs PD mode"),
])
def test_bad_warm_up_settings_name_the_flag(overrides: dict, flag_message: str) -> None:
    settings = {"served_model_name": MODEL, "tokenizer_path": "unused", "max_model_len": 64,
                "prefill_urls": ("http://p",), "decode_urls": ("http://d",), "kv_channel": "nixl"}
    config = RouterConfig(**{**settings, **overrides})
    with pytest.raises(ValueError, match=flag_message.replace("(", r"\(").replace(")", r"\)")):
        config.validate()
