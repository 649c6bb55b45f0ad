"""The gateway's queues while a deployment is saturated (inference/gateway/flow_control.py):
highest band first, inside a band the fairness flow holding fewest slots and then the one
served least, first come first served inside a flow; the lowest band shed first with 429 and
Retry-After; a wait past the timeout a 503; and, through the gateway, who may choose a band,
the queues' metrics and admin view, and an alias's next target serving what a saturated first
target sheds.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from inference.gateway.config import parse_config
from inference.gateway.flow_control import DeploymentQueue, FlowControl, Refused
from inference.router.errors import RequestError
from inference.router.keys import new_key
from tests.unit.conftest import wait_until
from tests.unit.gateway_stubs import (
    ADMIN_AUTH,
    StartGateway,
    StubRouter,
    bearer,
    configuration,
    deployment,
    key_entry,
)

MakeRouter = Callable[[str], Awaitable[StubRouter]]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Served(list[str]):
    """The names of the requests served, in order, and the flows holding slots, oldest first
    (the queue is told which flow's request ended)."""

    def __init__(self, *holding: str):
        super().__init__()
        self.holding = deque(holding)


async def queued(queue: DeploymentQueue, band: str, flow: str, served: Served,
                 name: str) -> None:
    """Wait for a slot, note who got it, and hold it until the test releases it."""
    await queue.acquire(band, flow)
    served.append(name)
    served.holding.append(flow)


async def enqueue(queue: DeploymentQueue, *requests: tuple[str, str, str],
                  served: Served) -> list[asyncio.Task[None]]:
    tasks = []
    for band, flow, name in requests:
        tasks.append(asyncio.create_task(queued(queue, band, flow, served, name)))
        await asyncio.sleep(0)  # in this order: each is queued before the next arrives
    return tasks


async def refusal(waiting: Awaitable[Any]) -> Refused:
    """The Refused that ends ``waiting`` (a request's wait for a slot)."""
    with pytest.raises(Refused) as refused:
        await waiting
    return refused.value


async def drain(queue: DeploymentQueue, served: Served, count: int) -> None:
    """Release the oldest slot, one at a time, and let the next request take it."""
    for _ in range(count):
        before = len(served)
        queue.release(0.5, served.holding.popleft())
        await wait_until(lambda before=before: len(served) == before + 1)


async def test_the_highest_band_goes_first_then_first_come_first_served() -> None:
    queue = DeploymentQueue("d", limit=1)
    assert await queue.acquire("low", "a") == 0.0  # a free slot: no wait at all
    served = Served("a")
    await enqueue(queue, ("low", "a", "low-1"), ("normal", "a", "normal-1"), ("low", "a", "low-2"),
                  ("high", "a", "high-1"), ("normal", "a", "normal-2"), served=served)
    assert served == [] and queue.stats().waiting == {("low", "a"): 2, ("normal", "a"): 2,
                                                      ("high", "a"): 1}
    await drain(queue, served, 5)
    assert served == ["high-1", "normal-1", "normal-2", "low-1", "low-2"]
    assert queue.in_flight == 1 and queue.stats().waiting == {}


async def test_flows_inside_a_band_take_turns_whatever_each_sends() -> None:
    queue = DeploymentQueue("d", limit=1)
    await queue.acquire("normal", "x")
    served = Served("x")
    # Team a floods before team b sends anything: b still gets every other slot.
    await enqueue(queue, *[("normal", "a", f"a{n}") for n in range(5)],
                  ("normal", "b", "b0"), ("normal", "b", "b1"), served=served)
    await drain(queue, served, 7)
    assert served == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]


async def test_a_flow_that_won_fewer_slots_while_nothing_waited_is_made_whole_first() -> None:
    # Nothing waited, so arrivals took the slots first come first served: a three, b one.
    queue = DeploymentQueue("d", limit=4)
    for flow in ("a", "a", "a", "b"):
        assert await queue.acquire("normal", flow) == 0.0
    served = Served("a", "a", "a", "b")
    await enqueue(queue, ("normal", "a", "a0"), ("normal", "a", "a1"), ("normal", "b", "b0"),
                  ("normal", "b", "b1"), served=served)
    assert queue.stats().holding == {"a": 3, "b": 1}
    # a's first slot to end goes to b although a's request came first and neither was served
    # from the queue yet (taking turns alone would have left a with three slots to b's one).
    await drain(queue, served, 1)
    assert served == ["b0"]
    assert queue.stats().holding == {"a": 2, "b": 2}
    # Two slots each: from then on the flows take turns.
    await drain(queue, served, 3)
    assert served == ["b0", "a0", "a1", "b1"]


async def test_a_full_queue_sheds_the_newest_of_the_lowest_band_for_a_higher_one() -> None:
    queue = DeploymentQueue("d", limit=1, max_queue=2)
    await queue.acquire("normal", "x")
    served = Served("x")
    low = await enqueue(queue, ("low", "a", "low-1"), ("low", "b", "low-2"), served=served)
    # A third low request finds the queue full of its own band: it is the one refused.
    with pytest.raises(Refused) as refused:
        await queue.acquire("low", "c")
    assert (refused.value.status, refused.value.code) == (429, "queue_full")
    assert "'low' is shed first" in refused.value.message and refused.value.retry_after_s >= 1
    # A high one displaces the newest low request, whose wait ends in a 429.
    high = asyncio.create_task(queued(queue, "high", "c", served, "high"))
    await wait_until(lambda: low[1].done())
    with pytest.raises(Refused) as shed:
        await low[1]
    assert (shed.value.status, shed.value.code) == (429, "shed")
    await drain(queue, served, 2)
    assert served == ["high", "low-1"]
    await asyncio.gather(low[0], high)


async def test_inside_a_band_a_full_queue_sheds_from_the_flow_that_holds_most() -> None:
    queue = DeploymentQueue("d", limit=1, max_queue=4)
    await queue.acquire("normal", "x")
    served = Served("x")
    flood = await enqueue(queue, *[("normal", "a", f"a{n}") for n in range(4)], served=served)
    # b's first two displace a's newest; a third would give b more than a: b's is refused.
    light = await enqueue(queue, ("normal", "b", "b0"), ("normal", "b", "b1"), served=served)
    await wait_until(lambda: flood[3].done() and flood[2].done())
    for task in flood[2:]:
        assert (await refusal(task)).code == "shed"
    assert (await refusal(queue.acquire("normal", "b"))).code == "queue_full"
    assert queue.stats().waiting == {("normal", "a"): 2, ("normal", "b"): 2}
    await drain(queue, served, 4)
    assert served == ["a0", "b0", "a1", "b1"]
    await asyncio.gather(*flood[:2], *light)


async def test_what_a_flow_holds_in_flight_counts_when_the_queue_sheds() -> None:
    # a won both slots; the queue holds one request of each flow. b's second displaces a's
    # waiting one although a and b wait as many: a holds three places of the deployment to
    # b's one (counted by waiting requests alone, b's would have been refused).
    queue = DeploymentQueue("d", limit=2, max_queue=2)
    for _ in range(2):
        await queue.acquire("normal", "a")
    served = Served("a", "a")
    [waiting_a, b0] = await enqueue(queue, ("normal", "a", "a-waiting"), ("normal", "b", "b0"),
                                    served=served)
    b1 = asyncio.create_task(queued(queue, "normal", "b", served, "b1"))
    await wait_until(lambda: waiting_a.done())
    assert (await refusal(waiting_a)).code == "shed"
    # a, still holding two slots, would hold as much as b with one more: refused.
    assert (await refusal(queue.acquire("normal", "a"))).code == "queue_full"
    await drain(queue, served, 2)
    assert served == ["b0", "b1"] and queue.stats().waiting == {}
    await asyncio.gather(b0, b1)


async def test_a_request_that_waits_too_long_gets_a_503_and_leaves_the_queue() -> None:
    queue = DeploymentQueue("d", limit=1, timeout_s=0.05)
    await queue.acquire("normal", "a")
    with pytest.raises(Refused) as refused:
        await queue.acquire("high", "b")
    assert (refused.value.status, refused.value.code) == (503, "queue_timeout")
    assert "waited 0.05 s in the gateway's 'high' priority queue" in refused.value.message
    assert queue.stats().waiting == {}
    queue.release(0.1, "a")
    assert queue.in_flight == 0


async def test_a_client_that_leaves_gives_its_place_and_any_slot_back() -> None:
    queue = DeploymentQueue("d", limit=1)
    await queue.acquire("normal", "a")
    served = Served("a")
    [leaver, stayer] = await enqueue(queue, ("normal", "a", "leaver"), ("normal", "b", "stayer"),
                                     served=served)
    leaver.cancel()
    await wait_until(lambda: queue.stats().waiting == {("normal", "b"): 1})
    await drain(queue, served, 1)
    assert served == ["stayer"]
    await stayer

    # Granted a slot in the same step as it is cancelled: the slot goes to the next request.
    [granted, next_one] = await enqueue(queue, ("normal", "a", "granted"), ("normal", "a", "next"),
                                        served=served)
    queue.release(0.1, served.holding.popleft())  # grants "granted", whose task has not run yet
    granted.cancel()
    await wait_until(lambda: "next" in served)
    assert "granted" not in served and queue.in_flight == 1
    await next_one


async def test_a_larger_limit_lets_waiting_requests_in_and_retry_after_follows_the_queue() -> None:
    clock = Clock()
    flows = FlowControl(clock)
    flows.configure({"d": 1, "open": 0}, max_queue=10, timeout_s=30)
    assert flows.queue("open") is None
    queue = flows.queue("d")
    assert queue is not None
    await queue.acquire("normal", "a")
    for _ in range(5):
        queue.release(9.0, "a")  # each request held its slot about 9 s
        await queue.acquire("normal", "a")
    served = Served("a")
    await enqueue(queue, *[("normal", "a", f"r{n}") for n in range(4)], served=served)
    # Four ahead, one slot, ~7 s each (the average moves toward 9 s): tens of seconds.
    assert 20 <= queue.retry_after_s() <= 40
    flows.configure({"d": 3}, max_queue=10, timeout_s=30)
    await wait_until(lambda: len(served) == 2)
    assert queue.in_flight == 3 and flows.queue("d") is queue
    flows.configure({}, max_queue=10, timeout_s=30)
    assert flows.queue("d") is None


# ---- through the gateway -----------------------------------------------------------------

def saturated_config(router: str, *keys: dict[str, Any], max_queue: int = 2,
                     extra: tuple[dict[str, Any], ...] = (),
                     aliases: dict[str, list[str]] | None = None) -> dict[str, Any]:
    config = configuration({**deployment("d", router), "max_concurrency": 1}, *extra,
                           keys=keys, require_key=True, aliases=aliases)
    config["queue"] = {"max_queue": max_queue, "timeout_s": 30}
    return config


async def test_the_gateway_queues_by_key_priority_sheds_with_429_and_reports_its_queues(
        start_gateway: StartGateway, make_router: MakeRouter) -> None:
    router = await make_router("d")
    router.gate = asyncio.Event()
    batch, interactive = new_key(), new_key()
    running = await start_gateway(saturated_config(
        router.url,
        {**key_entry(batch, 1, ["d"]), "team": "batch-team", "priority": "low"},
        {**key_entry(interactive, 2, ["d"]), "team": "web", "priority": "high"}))
    client = running.client

    def post(key: str, name: str) -> asyncio.Task[Any]:
        return asyncio.create_task(client.post("/v1/completions", headers=bearer(key), json={
            "model": "model-d", "prompt": name, "stream": True}))

    holder = post(batch, "holder")
    await wait_until(lambda: len(router.requests) == 1)
    waiting = [post(batch, "low-1"), post(batch, "low-2")]
    await wait_until(lambda: running.gateway.flows.queues["d"].stats().waiting
                     == {("low", "batch-team"): 2})
    queues = await (await client.get("/admin/queues", headers=ADMIN_AUTH)).json()
    assert queues == {"deployments": [{"deployment": "d", "in_flight": 1, "limit": 1, "waiting": [
        {"band": "low", "flow": "batch-team", "requests": 2}],
        "in_flight_by_flow": [{"flow": "batch-team", "requests": 1}]}]}
    assert await running.metric("pdserve_gateway_queue_waiting",
                                {"deployment": "d", "band": "low", "flow": "batch-team"}) == 2

    # The queue is full: another low request is refused at once, a high one displaces low-2.
    refused = await client.post("/v1/completions", headers=bearer(batch),
                                json={"model": "model-d", "prompt": "low-3"})
    assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["X-Pdserve-Deployment"] == "d"
    assert (await refused.json())["error"]["code"] == "queue_full"
    urgent = post(interactive, "urgent")
    shed = await waiting[1]
    assert shed.status == 429 and (await shed.json())["error"]["code"] == "shed"

    router.gate.set()
    answers = [await task for task in (holder, urgent, waiting[0])]
    assert [a.status for a in answers] == [200, 200, 200]
    for answer in answers:
        await answer.read()
    # The router saw the high request before the low one that had waited longer.
    assert [seen.body["prompt"] for seen in router.requests] == ["holder", "urgent", "low-1"]
    assert await running.metric("pdserve_gateway_shed_total",
                                {"deployment": "d", "band": "low", "reason": "queue_full"}) == 1
    assert await running.metric("pdserve_gateway_shed_total",
                                {"deployment": "d", "band": "low", "reason": "shed"}) == 1
    assert await running.metric("pdserve_gateway_in_flight", {"deployment": "d"}) == 0


async def test_only_a_key_allowed_to_may_choose_its_band_and_flow_and_never_above_its_own(
        start_gateway: StartGateway, make_router: MakeRouter) -> None:
    router = await make_router("d")
    plain, trusted = new_key(), new_key()
    running = await start_gateway(saturated_config(
        router.url, key_entry(plain, 1, ["d"]),
        {**key_entry(trusted, 2, ["d"]), "priority": "normal", "priority_header": True}))

    async def ask(key: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        response = await running.client.post("/v1/completions", headers={**bearer(key), **headers},
                                             json={"model": "model-d", "prompt": "x"})
        return response.status, await response.json()

    status, body = await ask(plain, {"X-Pdserve-Priority": "low"})
    assert status == 403 and body["error"]["param"] == "X-Pdserve-Priority"
    status, body = await ask(plain, {"X-Pdserve-Fairness-Id": "me"})
    assert status == 403 and body["error"]["param"] == "X-Pdserve-Fairness-Id"
    status, body = await ask(trusted, {"X-Pdserve-Priority": "high"})
    assert status == 403 and "highest band is 'normal'" in body["error"]["message"]
    status, body = await ask(trusted, {"X-Pdserve-Priority": "urgent"})
    assert status == 400 and body["error"]["param"] == "X-Pdserve-Priority"
    status, body = await ask(trusted, {"X-Pdserve-Fairness-Id": "x" * 65})
    assert status == 400 and body["error"]["param"] == "X-Pdserve-Fairness-Id"
    assert router.requests == []  # nothing refused reached the router
    status, _ = await ask(trusted, {"X-Pdserve-Priority": "low", "X-Pdserve-Fairness-Id": "job-7"})
    assert status == 200
    assert await running.metric("pdserve_gateway_queue_wait_seconds_count",
                                {"deployment": "d", "band": "low"}) == 1


async def test_an_alias_sends_what_its_saturated_first_target_sheds_to_the_next(
        start_gateway: StartGateway, make_router: MakeRouter) -> None:
    first, second = await make_router("d"), await make_router("spare")
    first.gate = asyncio.Event()
    key = new_key()
    running = await start_gateway(saturated_config(
        first.url, key_entry(key, 1, ["d", "spare"]), max_queue=0,
        extra=(deployment("spare", second.url),), aliases={"chat": ["d", "spare"]}))
    holder = asyncio.create_task(running.client.post("/v1/completions", headers=bearer(key), json={
        "model": "chat", "prompt": "holder", "stream": True}))
    await wait_until(lambda: len(first.requests) == 1)
    response = await running.client.post("/v1/completions", headers=bearer(key),
                                         json={"model": "chat", "prompt": "next"})
    assert response.status == 200 and response.headers["X-Pdserve-Deployment"] == "spare"
    assert await running.metric("pdserve_gateway_fallbacks_total",
                                {"model": "chat", "from_deployment": "d", "to_deployment": "spare"}) == 1
    # Its own name has no next target: the 429 goes to the client.
    refused = await running.client.post("/v1/completions", headers=bearer(key),
                                        json={"model": "model-d", "prompt": "again"})
    assert refused.status == 429 and refused.headers["X-Pdserve-Deployment"] == "d"
    first.gate.set()
    await (await holder).read()


@pytest.mark.parametrize(("change", "param"), [
    ({"max_concurrency": -1}, "deployments[0].max_concurrency"),
    ({"max_concurrency": True}, "deployments[0].max_concurrency"),
    ({"queue": {"max_queue": "8"}}, "queue.max_queue"),
    ({"queue": {"timeout_s": 0}}, "queue.timeout_s"),
    ({"queue": []}, "queue"),
    ({"priority": "urgent"}, "keys[0].priority"),
    ({"priority_header": "yes"}, "keys[0].priority_header"),
    ({"team": 3}, "keys[0].team"),
])
def test_a_bad_queue_setting_is_refused_naming_its_field(change: dict[str, Any], param: str) -> None:
    config = configuration(deployment("d", "http://127.0.0.1:1"),
                           keys=(key_entry(new_key(), 1, ["d"]),))
    if "max_concurrency" in change:
        config["deployments"][0].update(change)
    elif "queue" in change:
        config.update(change)
    else:
        config["keys"][0].update(change)
    with pytest.raises(RequestError) as error:
        parse_config(config)
    assert error.value.status == 400 and error.value.param == param


async def test_with_every_deployment_open_a_valid_key_still_brings_its_band_and_others_pass(
        start_gateway: StartGateway, make_router: MakeRouter) -> None:
    router = await make_router("d")
    router.gate = asyncio.Event()
    key = new_key()
    # The key opens no deployment of its own: "d" stays open, as its router is.
    config = configuration({**deployment("d", router.url), "max_concurrency": 1},
                           keys=({**key_entry(key, 1, []), "team": "web", "priority": "high"},))
    running = await start_gateway(config)
    client = running.client

    def post(name: str, headers: dict[str, str]) -> asyncio.Task[Any]:
        return asyncio.create_task(client.post("/v1/completions", headers=headers, json={
            "model": "model-d", "prompt": name, "stream": True}))

    holder = post("holder", {})
    await wait_until(lambda: len(router.requests) == 1)
    waiting = [post("anonymous", {}), post("wrong-key", bearer(new_key())),
               post("keyed", bearer(key))]
    await wait_until(lambda: running.gateway.flows.queues["d"].stats().waiting == {
        ("normal", "anonymous"): 2, ("high", "web"): 1})
    router.gate.set()
    answers = [await task for task in (holder, *waiting)]
    assert [a.status for a in answers] == [200, 200, 200, 200]
    for answer in answers:
        await answer.read()
    assert [seen.body["prompt"] for seen in router.requests] == [
        "holder", "keyed", "anonymous", "wrong-key"]
