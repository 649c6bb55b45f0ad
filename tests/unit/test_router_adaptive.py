"""pd_adaptive: the prefill queue's order, its slots on every exit path, the length threshold
derived from measured speed, and where the router sends each request (against stub workers;
the effect on real vLLM workers is what bench/pd_mixed.py measures)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from inference.router.adaptive import AdaptivePlacer, BusyWindow, PrefillQueue
from inference.router.asked_placement import PLACEMENT_HEADER
from inference.router.backends import Backend, NoBackendAvailable
from inference.router.keys import CONSOLE_KEY_ID, key_hash, new_key, public_prefix
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]
PLACEMENTS = "pdserve_router_pd_placements_total"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chooser(backends: list[Backend]) -> Callable[[Callable[[Backend], bool]], Backend | None]:
    def choose(is_free: Callable[[Backend], bool]) -> Backend | None:
        return next((b for b in backends if b.healthy and is_free(b)), None)
    return choose


def ready_backend(url: str = "http://p0") -> Backend:
    backend = Backend(url=url, role="prefill")
    backend.healthy = True
    return backend


def always_ready() -> None:
    return None


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_queue_serves_the_highest_response_ratio_first_so_short_prompts_pass_long_ones() -> None:
    clock = FakeClock()
    queue = PrefillQueue(slots=1, clock=clock)
    worker = ready_backend()
    choose = chooser([worker])
    assert await queue.acquire(500, 0.5, choose, always_ready) is worker

    order: list[str] = []

    async def wait(name: str, tokens: int) -> None:
        await queue.acquire(tokens, tokens / 1000, choose, always_ready)
        order.append(name)

    long = asyncio.create_task(wait("long", 1000))
    await settle()
    clock.now += 0.1
    short = asyncio.create_task(wait("short", 64))
    await settle()
    assert queue.depth == 2
    clock.now += 0.1
    # long: (0.2 + 1.0) / 1.0 = 1.2; short: (0.1 + 0.064) / 0.064 = 2.6
    queue.release(worker, choose)
    await settle()
    assert order == ["short"]
    queue.release(worker, choose)
    await settle()
    assert order == ["short", "long"]
    queue.release(worker, choose)
    await asyncio.gather(long, short)
    assert queue.active == 0


async def test_waiting_ages_a_long_prompt_past_fresh_short_ones() -> None:
    clock = FakeClock()
    queue = PrefillQueue(slots=1, clock=clock)
    worker = ready_backend()
    choose = chooser([worker])
    await queue.acquire(500, 0.5, choose, always_ready)
    order: list[str] = []

    async def wait(name: str, tokens: int) -> None:
        await queue.acquire(tokens, tokens / 1000, choose, always_ready)
        order.append(name)

    tasks = [asyncio.create_task(wait("long", 1000))]
    await settle()
    clock.now += 30.0  # long: (30 + 1) / 1 = 31
    tasks.append(asyncio.create_task(wait("fresh-short", 64)))
    await settle()
    clock.now += 0.5  # fresh short: (0.5 + 0.064) / 0.064 = 8.8 < 31.5
    queue.release(worker, choose)
    await settle()
    assert order == ["long"]
    queue.release(worker, choose)
    await settle()
    assert order == ["long", "fresh-short"]
    queue.release(worker, choose)
    await asyncio.gather(*tasks)


async def test_a_cancelled_waiter_leaves_the_queue_and_a_cancelled_grant_frees_its_slot() -> None:
    queue = PrefillQueue(slots=1)
    worker = ready_backend()
    choose = chooser([worker])
    await queue.acquire(10, 0.01, choose, always_ready)

    gone = asyncio.create_task(queue.acquire(10, 0.01, choose, always_ready))
    await settle()
    assert queue.depth == 1
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queue.depth == 0

    # Granted, then cancelled before it resumed: depending on the Python version the grant
    # either reaches the caller (who releases it) or comes back at once; never is it lost.
    granted = asyncio.create_task(queue.acquire(10, 0.01, choose, always_ready))
    await settle()
    queue.release(worker, choose)
    granted.cancel()
    [outcome] = await asyncio.gather(granted, return_exceptions=True)
    if isinstance(outcome, Backend):
        queue.release(outcome, choose)
    else:
        assert isinstance(outcome, asyncio.CancelledError)
    assert queue.active == 0
    assert queue.free(worker)


async def test_a_waiter_gives_up_when_no_prefill_worker_is_left() -> None:
    queue = PrefillQueue(slots=1)
    worker = ready_backend()
    choose = chooser([worker])
    await queue.acquire(10, 0.01, choose, always_ready)

    def ensure_ready() -> None:
        if not worker.healthy:
            raise NoBackendAvailable("prefill", [worker])

    waiting = asyncio.create_task(queue.acquire(10, 0.01, choose, ensure_ready))
    await settle()
    worker.mark(False, "refused")
    with pytest.raises(NoBackendAvailable):
        await asyncio.wait_for(waiting, 2 * PrefillQueue.RECHECK_S + 1)
    assert queue.depth == 0


def test_busy_window_counts_only_the_last_window() -> None:
    clock = FakeClock()
    busy = BusyWindow(10.0, clock)
    busy.start()
    clock.now += 2.0
    busy.stop()
    assert busy.fraction() == pytest.approx(0.2)
    clock.now += 9.0  # the span now lies 1 s before the window
    assert busy.fraction() == pytest.approx(0.1)
    clock.now += 5.0
    assert busy.fraction() == 0.0
    busy.start()
    clock.now += 1.0
    assert busy.fraction() == pytest.approx(0.1)


def test_the_local_threshold_follows_measured_speed_never_below_one_block() -> None:
    placer = AdaptivePlacer(floor_tokens=128, stall_budget_s=0.25, queue=PrefillQueue(1))
    assert placer.local_max_tokens() == 128  # nothing measured yet
    placer.remote_speed.observe(1000, 1.0)
    assert placer.local_max_tokens() == 250
    placer.local_speed.observe(400, 1.0)  # the decode workers' own speed wins
    assert placer.local_max_tokens() == 128
    placer.local_speed.observe(4000, 1.0)
    assert placer.local_max_tokens() == int((0.2 * 4000 + 0.8 * 400) * 0.25)


def test_a_short_prompt_goes_to_an_idle_prefill_worker_only_when_decode_is_busier() -> None:
    placer = AdaptivePlacer(floor_tokens=16, stall_budget_s=0.25, queue=PrefillQueue(1))
    prefill, decode = ready_backend("http://p"), ready_backend("http://d")
    assert placer.place(200, [prefill], [decode]).where == "remote"
    assert placer.place(10, [prefill], [decode]).where == "local"
    decode.in_flight = 2
    assert placer.place(10, [prefill], [decode]).where == "prefill_whole"
    prefill.in_flight = 2
    assert placer.place(10, [prefill], [decode]).where == "local"


def completion(words: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": " ".join(["hello", "world"] * (words // 2)),
            "max_tokens": 4, **extra}


async def adaptive_router(start_router: StartRouter, make_stub: MakeStub,
                          **overrides: Any) -> tuple[RunningRouter, StubVLLM, StubVLLM]:
    prefill = await make_stub("prefill")
    decode = await make_stub("decode")
    settings: dict[str, Any] = {"pd_policy": "pd_adaptive", "local_prefill_max_tokens": 8,
                                "max_model_len": 512}
    settings.update(overrides)
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), **settings)
    return running, prefill, decode


async def test_short_prompts_stay_on_decode_and_long_ones_are_prefilled_remotely(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await adaptive_router(start_router, make_stub)

    response = await running.client.post("/v1/completions", json=completion(6))
    assert response.status == 200, await response.text()
    assert prefill.requests == []
    assert len(decode.requests) == 1

    response = await running.client.post("/v1/completions", json=completion(40))
    assert response.status == 200, await response.text()
    assert len(prefill.requests) == 1 and prefill.requests[0].body["max_tokens"] == 1
    assert len(decode.requests) == 2
    assert await running.metric(PLACEMENTS, {"placement": "local", "reason": "short_prompt"}) == 1
    assert await running.metric(PLACEMENTS, {"placement": "remote", "reason": "long_prompt"}) == 1
    speed = await running.metric("pdserve_router_prefill_tokens_per_second", {"where": "remote"})
    assert speed > 0
    assert await running.metric("pdserve_router_adaptive_local_max_tokens", {}) >= 8


async def test_an_idle_prefill_worker_takes_whole_short_requests_while_decode_is_busy(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await adaptive_router(start_router, make_stub)
    decode.stream_gate = asyncio.Event()
    held = asyncio.create_task(running.client.post("/v1/completions",
                                                   json=completion(6, stream=True)))
    await wait_until(lambda: decode.active == 1)

    response = await running.client.post("/v1/completions", json=completion(6))
    assert response.status == 200
    assert (await response.json())["choices"][0]["text"] == "prefill"
    [whole] = prefill.requests
    assert whole.body["max_tokens"] == 4 and "kv_transfer_params" not in whole.body
    assert await running.metric(PLACEMENTS, {"placement": "prefill_whole",
                                             "reason": "prefill_idle"}) == 1
    decode.stream_gate.set()
    await (await held).read()


async def test_remote_prefills_go_one_at_a_time_and_the_shortest_waiting_goes_first(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, decode = await adaptive_router(start_router, make_stub)
    prefill.seconds_per_prompt_token = 0.004

    async def send(words: int) -> None:
        response = await running.client.post("/v1/completions", json=completion(words))
        assert response.status == 200, await response.text()

    first = asyncio.create_task(send(60))
    await wait_until(lambda: prefill.active == 1)
    longer = asyncio.create_task(send(120))
    await wait_until(lambda: running.router.registry.primary.placer is not None
                     and running.router.registry.primary.placer.queue.depth == 1)
    shorter = asyncio.create_task(send(30))
    await asyncio.gather(first, longer, shorter)

    assert prefill.most_active == 1
    lengths = [len(r.body["prompt"].split()) for r in prefill.requests]
    assert lengths == [60, 30, 120]
    waited = await running.metric("pdserve_router_prefill_queue_wait_seconds_count", {})
    assert waited == 3
    assert running.router.registry.primary.placer.queue.active == 0


async def test_a_prompt_still_queued_at_its_timeout_gets_504_and_never_reaches_a_worker(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, prefill, _decode = await adaptive_router(start_router, make_stub,
                                                      request_timeout_s=1.0)
    prefill.seconds_per_prompt_token = 0.02  # 60 words: 1.2 s, past the timeout

    async def send(words: int) -> tuple[int, str]:
        response = await running.client.post("/v1/completions", json=completion(words))
        return response.status, (await response.json())["error"]["code"]

    holder = asyncio.create_task(send(60))
    await wait_until(lambda: prefill.active == 1)
    long = asyncio.create_task(send(120))
    await asyncio.sleep(0.1)
    short = asyncio.create_task(send(12))
    # When the holder times out, the short prompt goes first; the long one's own deadline
    # passes while it still waits.
    assert await long == (504, "request_timeout")
    assert await holder == (504, "request_timeout")
    assert await short == (504, "request_timeout")
    assert [len(r.body["prompt"].split()) for r in prefill.requests] == [60, 12]
    placer = running.router.registry.primary.placer
    assert placer is not None and placer.queue.depth == 0
    assert placer.queue.active == 0


async def test_the_console_names_a_requests_placement_and_no_tenant_can(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    """X-Pdserve-Placement overrides pd_adaptive's choice for the console's own key (the
    verification's pair check) and on a router that asks no key; a tenant's key is refused."""
    running, prefill, decode = await adaptive_router(start_router, make_stub)
    # A prompt pd_adaptive would keep on decode, sent through prefill instead.
    response = await running.client.post("/v1/completions", json=completion(6),
                                         headers={PLACEMENT_HEADER: "remote"})
    assert response.status == 200, await response.text()
    assert len(prefill.requests) == 1 and prefill.requests[0].body["max_tokens"] == 1
    assert len(decode.requests) == 1
    assert await running.metric(PLACEMENTS, {"placement": "remote", "reason": "asked"}) == 1
    # And a long one kept on decode.
    response = await running.client.post("/v1/completions", json=completion(40),
                                         headers={PLACEMENT_HEADER: "local"})
    assert response.status == 200 and len(prefill.requests) == 1 and len(decode.requests) == 2
    response = await running.client.post("/v1/completions", json=completion(6),
                                         headers={PLACEMENT_HEADER: "prefill"})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == PLACEMENT_HEADER and "remote, local" in error["message"]

    console, tenant = new_key(), new_key()
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"version": "v1", "require_key": True, "keys": [
        {"id": CONSOLE_KEY_ID, "prefix": public_prefix(console), "hash": key_hash(console),
         "state": "active", "limits": {}},
        {"id": 7, "prefix": public_prefix(tenant), "hash": key_hash(tenant), "state": "active",
         "limits": {}}]}))
    keyed, prefill, decode = await adaptive_router(start_router, make_stub, keys_file=str(keys))
    response = await keyed.client.post("/v1/completions", json=completion(6), headers={
        "Authorization": f"Bearer {tenant}", PLACEMENT_HEADER: "remote"})
    assert response.status == 403
    error = (await response.json())["error"]
    assert error["param"] == PLACEMENT_HEADER and error["code"] == "permission_denied"
    assert prefill.requests == [] and decode.requests == []
    response = await keyed.client.post("/v1/completions", json=completion(6), headers={
        "Authorization": f"Bearer {console}", PLACEMENT_HEADER: "remote"})
    assert response.status == 200 and len(prefill.requests) == 1
