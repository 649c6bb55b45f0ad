"""Revision groups: requests split by weight (smooth weighted round robin), sticky per session,
each served inside one group (a prefill of one revision never meets a decode of another); the
group admin API; drains that wait for streams and for KV that decode has yet to pull."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse

from inference.router.backends import Backend
from inference.router.config import RouterConfig
from inference.router.groups import Group
from inference.router.metrics import TOKEN_BUCKETS
from inference.router.selection import Selector, session_key
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

TOKEN = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GROUPS = "/admin/groups"
COMPLETION = {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4}


async def error_of(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    return (await response.json())["error"]


async def two_pd_groups(start_router: StartRouter, make_stub: MakeStub, weights: tuple[int, int],
                        **overrides: Any) -> tuple[RunningRouter, dict[str, list[StubVLLM]]]:
    """Revision 1 from the command line, revision 2 added through the admin API."""
    stubs = {rev: [await make_stub(f"prefill-{rev}"), await make_stub(f"decode-{rev}")]
             for rev in ("1", "2")}
    running = await start_router(prefill=(stubs["1"][0].url,), decode=(stubs["1"][1].url,),
                                 admin_token=TOKEN, **overrides)
    response = await running.client.post(GROUPS, headers=AUTH, json={
        "revision": "2", "mode": "pd", "prefill": [stubs["2"][0].url],
        "decode": [stubs["2"][1].url], "weight": weights[1]})
    assert response.status == 201, await response.text()
    await set_weights(running, {"1": weights[0], "2": weights[1]})
    return running, stubs


async def set_weights(running: RunningRouter, weights: dict[str, int]) -> dict[str, Any]:
    response = await running.client.put(f"{GROUPS}/weights", headers=AUTH,
                                        json={"weights": weights})
    assert response.status == 200, await response.text()
    return await response.json()


def request_ids(stub: StubVLLM) -> set[str]:
    return {r.headers["X-Request-Id"] for r in stub.requests if r.path.startswith("/v1/")}


# ---- selection --------------------------------------------------------------------------

def fake_group(revision: str, weight: int, state: str = "active") -> Group:
    return Group(revision=revision, mode="pd", pools={}, calls=None, forwarder=None,  # type: ignore[arg-type]
                 placer=None, prefill_stage=None, warmer=None, degraded=None,  # type: ignore[arg-type]
                 weight=weight, state=state)


def test_smooth_weighted_round_robin_is_exact_and_interleaved() -> None:
    groups = {"1": fake_group("1", 5), "2": fake_group("2", 1), "3": fake_group("3", 0)}
    selector = Selector()
    picks = [selector.pick(groups, None) for _ in range(6 * 100)]
    assert Counter(g.revision for g in picks if g) == {"1": 500, "2": 100}
    # nginx's sequence for 5:1: the light one in the middle of each cycle, never a run of both.
    assert [g.revision for g in picks[:6] if g] == ["1", "1", "1", "2", "1", "1"]


def test_no_routable_group_picks_none_never_a_weight_0_or_draining_one() -> None:
    groups = {"1": fake_group("1", 0), "2": fake_group("2", 100, state="draining")}
    assert Selector().pick(groups, "h:someone") is None


def test_sessions_stick_while_their_group_is_routable_and_the_map_is_bounded() -> None:
    groups = {"1": fake_group("1", 1), "2": fake_group("2", 1)}
    selector = Selector(max_sessions=3)
    first = {s: selector.pick(groups, s) for s in ("a", "b", "c")}
    for _ in range(5):
        assert all(selector.pick(groups, s) is g for s, g in first.items())
    selector.pick(groups, "d")  # the least recently used, "a", is forgotten
    assert sum(selector.sessions().values()) == 3
    held = first["b"]
    assert held is not None
    held.weight = 0
    assert selector.pick(groups, "b") is not held


def test_session_key_reads_the_header_first_then_the_user_field() -> None:
    assert session_key("abc", {"user": "u1"}) == "h:abc"
    assert session_key(None, {"user": "u1"}) == "u:u1"
    assert session_key(None, {"user": 7}) is None
    assert session_key("", {}) is None
    long_key = session_key("x" * 10_000, {})
    assert long_key is not None and len(long_key) < 64


# ---- requests through two groups --------------------------------------------------------

async def test_requests_split_by_weight_and_each_stays_in_its_group(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (90, 10), kv_channel="nixl")
    answered: dict[str, str] = {}
    for i in range(1000):
        response = await running.client.post(
            "/v1/completions", headers={"X-Request-Id": f"r{i}"},
            # Streamed every other cycle of ten: the picks of a cycle come in the same order.
            json={**COMPLETION, "stream": i // 10 % 2 == 0})
        assert response.status == 200
        body = await response.read()
        revision = response.headers["X-Pdserve-Revision"]
        assert response.headers.getall("X-Pdserve-Revision") == [revision]
        assert f"decode-{revision}".encode() in body
        answered[f"r{i}"] = revision
    assert Counter(answered.values()) == {"1": 900, "2": 100}
    for revision, (prefill, decode) in stubs.items():
        mine = {rid for rid, rev in answered.items() if rev == revision}
        # Every request prefilled and decoded in its own group, never across.
        assert request_ids(prefill) == mine
        assert request_ids(decode) == mine
    assert await running.metric("pdserve_router_requests_total",
                                {"endpoint": "completions", "status": "200",
                                 "role": "prefill+decode", "revision": "2"}) == 100
    assert await running.metric("pdserve_router_ttft_seconds_count", {"revision": "2"}) == 50
    assert await running.metric("pdserve_router_tpot_seconds_count", {"revision": "2"}) == 50
    assert await running.metric("pdserve_router_itl_seconds_count", {"revision": "1"}) > 0
    assert await running.metric("pdserve_router_kv_handoff_seconds_count", {"revision": "1"}) == 900


async def test_a_group_at_weight_0_never_gets_a_request(start_router: StartRouter,
                                                        make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    for i in range(50):
        response = await running.client.post(
            "/v1/completions", json=COMPLETION,
            headers={"X-Session-Id": f"s{i}"} if i % 2 else {})
        assert response.headers["X-Pdserve-Revision"] == "1"
    # Not even when the only routable group cannot serve: a green that failed its gate must see
    # nothing.
    for stub in stubs["1"]:
        await stub.close()
    await wait_until(lambda: not running.router.registry.groups["1"].pools["decode"].ready())
    assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 503
    assert all(not request_ids(stub) for stub in stubs["2"])


async def test_with_every_weight_0_requests_get_503_no_revision_routable(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _stubs = await two_pd_groups(start_router, make_stub, (0, 0))
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert (await error_of(response, 503))["code"] == "no_revision_routable"
    assert "X-Pdserve-Revision" not in response.headers
    health = await running.client.get("/health")
    assert health.status == 503 and (await health.json())["status"] == "unavailable"


async def test_sessions_stick_by_header_and_by_user(start_router: StartRouter,
                                                    make_stub: MakeStub) -> None:
    running, _stubs = await two_pd_groups(start_router, make_stub, (50, 50))

    async def revision_of(headers: dict[str, str], body: dict[str, Any]) -> str:
        response = await running.client.post("/v1/completions", headers=headers,
                                             json={**COMPLETION, **body})
        assert response.status == 200
        return response.headers["X-Pdserve-Revision"]

    sessions: dict[str, str] = {}
    for i in range(10):
        sessions[f"h{i}"] = await revision_of({"X-Session-Id": f"h{i}"}, {})
        sessions[f"u{i}"] = await revision_of({}, {"user": f"u{i}"})
    assert set(sessions.values()) == {"1", "2"}
    for _ in range(3):
        for i in range(10):
            assert await revision_of({"X-Session-Id": f"h{i}"}, {}) == sessions[f"h{i}"]
            assert await revision_of({}, {"user": f"u{i}"}) == sessions[f"u{i}"]
    listing = await (await running.client.get(GROUPS, headers=AUTH)).json()
    assert sum(listing["sessions"].values()) == 20
    # Weight 0 releases them: every session goes on in the other group.
    await set_weights(running, {"2": 0})
    for i in range(10):
        assert await revision_of({"X-Session-Id": f"h{i}"}, {}) == "1"
        assert await revision_of({}, {"user": f"u{i}"}) == "1"


async def test_a_colocated_group_beside_a_pd_group(start_router: StartRouter,
                                                   make_stub: MakeStub) -> None:
    prefill, decode, whole = (await make_stub("prefill-1"), await make_stub("decode-1"),
                              await make_stub("whole-2"))
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), admin_token=TOKEN)
    response = await running.client.post(GROUPS, headers=AUTH, json={
        "revision": "2", "mode": "colocated", "colocated": [whole.url], "weight": 50})
    assert response.status == 201, await response.text()
    created = await response.json()
    assert created["mode"] == "colocated" and list(created["roles"]) == ["colocated"]
    assert created["roles"]["colocated"]["backends"][0]["state"] == "ready"
    await set_weights(running, {"1": 50})
    seen = Counter()
    for i in range(20):
        response = await running.client.post("/v1/chat/completions", headers={"X-Request-Id": f"c{i}"},
                                             json={"model": MODEL, "stream": i % 2 == 0,
                                                   "messages": [{"role": "user", "content": "hello"}]})
        assert response.status == 200
        seen[response.headers["X-Pdserve-Revision"]] += 1
    assert seen == {"1": 10, "2": 10}
    assert len(request_ids(whole)) == 10
    assert request_ids(prefill) == request_ids(decode) and len(request_ids(decode)) == 10
    assert not request_ids(whole) & request_ids(decode)

    health = await (await running.client.get("/health")).json()
    assert health["status"] == "ok" and health["mode"] == "pd"
    assert set(health["roles"]) == {"prefill", "decode"}
    assert {rev: (g["mode"], g["weight"], g["state"], g["status"])
            for rev, g in health["groups"].items()} == {
        "1": ("pd", 50, "active", "ok"), "2": ("colocated", 50, "active", "ok")}
    backends = await (await running.client.get("/admin/backends", headers=AUTH)).json()
    assert backends["mode"] == "pd"
    assert {role: [(b["url"], b["revision"]) for b in info["backends"]]
            for role, info in backends["roles"].items()} == {
        "prefill": [(prefill.url, "1")], "decode": [(decode.url, "1")],
        "colocated": [(whole.url, "2")]}
    # Passed-through routes answer from a group too, and say which.
    tokenized = await running.client.post("/tokenize", json={"model": MODEL, "prompt": "hello"},
                                          headers={"X-Session-Id": "t"})
    assert tokenized.status == 200 and tokenized.headers["X-Pdserve-Revision"] in ("1", "2")


async def test_the_revision_is_in_the_timeline(start_router: StartRouter, make_stub: MakeStub,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), revision="blue-7")
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.headers["X-Pdserve-Revision"] == "blue-7"
    [line] = [json.loads(r.getMessage().removeprefix("timeline ")) for r in caplog.records
              if r.name == "pdserve.router.timeline"]
    assert line["revision"] == "blue-7"


def test_the_start_revision_must_be_a_label() -> None:
    config = RouterConfig(served_model_name=MODEL, tokenizer_path="/m", max_model_len=128,
                          prefill_urls=("http://a:1",), decode_urls=("http://b:2",),
                          revision="blue green")
    with pytest.raises(ValueError, match="--revision"):
        config.validate()


def test_the_token_latency_buckets_are_fine_from_10_ms_to_10_s() -> None:
    inside = [b for b in TOKEN_BUCKETS if 0.01 <= b <= 10]
    assert inside[0] == 0.01 and inside[-1] == 10
    assert all(high / low <= 1.5 for low, high in zip(inside, inside[1:], strict=False))


# ---- the admin API ----------------------------------------------------------------------

async def test_groups_are_listed_with_their_members(start_router: StartRouter,
                                                    make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    listing = await (await running.client.get(GROUPS, headers=AUTH)).json()
    assert [(g["revision"], g["mode"], g["weight"], g["state"], g["in_flight"], g["kv_pending"])
            for g in listing["groups"]] == [("1", "pd", 100, "active", 0, 0),
                                            ("2", "pd", 0, "active", 0, 0)]
    assert listing["groups"][1]["roles"]["prefill"] == {
        "policy": "least_outstanding",
        "backends": [{"role": "prefill", "url": stubs["2"][0].url, "state": "ready",
                      "in_flight": 0, "error": "", "kv_pending": 0}]}
    assert listing["sessions"] == {}
    assert (await running.client.get(GROUPS)).status == 401


@pytest.mark.parametrize(("body", "param"), [
    ({"revision": "bad label", "mode": "pd"}, "revision"),
    ({"revision": "", "mode": "pd"}, "revision"),
    ({"revision": "x" * 33, "mode": "pd"}, "revision"),
    ({"revision": 2, "mode": "pd"}, "revision"),
    ({"revision": "2", "mode": "split"}, "mode"),
    ({"revision": "2"}, "mode"),
    ({"revision": "2", "mode": "pd", "prefill": ["http://127.0.0.1:9"]}, "decode"),
    ({"revision": "2", "mode": "pd", "prefill": [], "decode": ["http://127.0.0.1:9"]}, "prefill"),
    ({"revision": "2", "mode": "pd", "prefill": "http://127.0.0.1:9",
      "decode": ["http://127.0.0.1:9"]}, "prefill"),
    ({"revision": "2", "mode": "pd", "prefill": ["ftp://127.0.0.1:9"],
      "decode": ["http://127.0.0.1:9"]}, "prefill"),
    ({"revision": "2", "mode": "pd", "prefill": ["http://127.0.0.1:9"],
      "decode": ["http://127.0.0.1:9/v1"]}, "decode"),
    ({"revision": "2", "mode": "pd", "prefill": ["http://127.0.0.1:9", "http://127.0.0.1:9/"],
      "decode": ["http://127.0.0.1:8"]}, "prefill"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"],
      "decode": ["http://127.0.0.1:8"]}, "decode"),
    ({"revision": "2", "mode": "colocated"}, "colocated"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"], "weight": -1},
     "weight"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"], "weight": 1.5},
     "weight"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"], "weight": "10"},
     "weight"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"], "weight": True},
     "weight"),
    ({"revision": "2", "mode": "colocated", "colocated": ["http://127.0.0.1:9"], "colour": "g"},
     "colour"),
])
async def test_a_bad_group_is_refused_naming_the_field(start_router: StartRouter,
                                                       make_stub: MakeStub, body: dict[str, Any],
                                                       param: str) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), admin_token=TOKEN)
    error = await error_of(await running.client.post(GROUPS, headers=AUTH, json=body), 400)
    assert error["param"] == param
    assert list(running.router.registry.groups) == ["1"]


async def test_a_revision_that_is_there_is_409(start_router: StartRouter,
                                               make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    response = await running.client.post(GROUPS, headers=AUTH, json={
        "revision": "1", "mode": "colocated", "colocated": [stubs["2"][1].url]})
    error = await error_of(response, 409)
    assert (error["code"], error["param"]) == ("group_exists", "revision")


async def test_weights_change_all_or_nothing(start_router: StartRouter,
                                             make_stub: MakeStub) -> None:
    running, _stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    path = f"{GROUPS}/weights"
    for body, param in (({"weights": {"1": 10, "9": 90}}, "weights.9"),
                        ({"weights": {"2": 90, "1": -1}}, "weights.1"),
                        ({"weights": {"2": "90"}}, "weights.2"),
                        ({"weights": {}}, "weights"),
                        ({"weights": [90, 10]}, "weights"),
                        ([], "weights")):
        error = await error_of(await running.client.put(path, headers=AUTH, json=body), 400)
        assert error["param"] == param
    assert {g.revision: g.weight for g in running.router.registry.groups.values()} == {"1": 100, "2": 0}
    listing = await set_weights(running, {"1": 70, "2": 30})
    assert [(g["revision"], g["weight"]) for g in listing["groups"]] == [("1", 70), ("2", 30)]
    seen = Counter()
    for _ in range(10):
        response = await running.client.post("/v1/completions", json=COMPLETION)
        seen[response.headers["X-Pdserve-Revision"]] += 1
    assert seen == {"1": 7, "2": 3}


async def test_delete_refuses_an_unknown_and_the_last_active_group(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    error = await error_of(await running.client.delete(f"{GROUPS}/9", headers=AUTH), 404)
    assert error["code"] == "group_not_found"
    assert (await running.client.delete(f"{GROUPS}/1", headers=AUTH)).status == 202
    error = await error_of(await running.client.delete(f"{GROUPS}/2", headers=AUTH), 409)
    assert (error["code"], error["param"]) == ("last_group", "revision")
    # Requests now go to 2, whose weight was 0: 1 drained away. Weight first.
    await wait_until(lambda: "1" not in running.router.registry.groups)
    await set_weights(running, {"2": 100})
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert response.headers["X-Pdserve-Revision"] == "2"
    health = await (await running.client.get("/health")).json()
    assert list(health["groups"]) == ["2"] and health["status"] == "ok"


async def test_backends_admin_names_the_group_once_there_are_two(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (100, 0))
    extra = await make_stub("decode-2b")
    error = await error_of(await running.client.post(
        "/admin/backends", headers=AUTH, json={"role": "decode", "url": extra.url}), 400)
    assert error["param"] == "revision"
    error = await error_of(await running.client.post(
        "/admin/backends", headers=AUTH,
        json={"role": "decode", "url": extra.url, "revision": "7"}), 404)
    assert (error["code"], error["param"]) == ("group_not_found", "revision")
    response = await running.client.post("/admin/backends", headers=AUTH,
                                         json={"role": "decode", "url": extra.url, "revision": "2"})
    assert response.status == 201
    assert [b.url for b in running.router.registry.groups["2"].pools["decode"].backends] == [
        stubs["2"][1].url, extra.url]
    error = await error_of(await running.client.delete(
        "/admin/backends", headers=AUTH, params={"role": "decode", "url": extra.url}), 400)
    assert error["param"] == "revision"
    response = await running.client.delete(
        "/admin/backends", headers=AUTH,
        params={"role": "decode", "url": extra.url, "revision": "2"})
    assert response.status == 202


# ---- drains -----------------------------------------------------------------------------

async def test_a_deleted_group_finishes_its_stream_then_disappears(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, stubs = await two_pd_groups(start_router, make_stub, (0, 100))
    gate = asyncio.Event()
    stubs["2"][1].stream_gate = gate
    held = await running.client.post("/v1/completions", json={**COMPLETION, "stream": True},
                                     headers={"X-Session-Id": "kept"})
    assert held.headers["X-Pdserve-Revision"] == "2"
    chunks = stubs["2"][1].sse_chunks("completions")
    assert await asyncio.wait_for(held.content.readuntil(b"\n\n"), timeout=3) == chunks[0]
    await set_weights(running, {"1": 100})

    response = await running.client.delete(f"{GROUPS}/2", headers=AUTH)
    assert response.status == 202
    removed = await response.json()
    assert (removed["state"], removed["weight"], removed["in_flight"]) == ("draining", 0, 1)
    # Out of selection at once, its sessions forgotten.
    response = await running.client.post("/v1/completions", json=COMPLETION,
                                         headers={"X-Session-Id": "kept"})
    assert response.headers["X-Pdserve-Revision"] == "1"
    await asyncio.sleep(0.3)  # probe rounds: none may close the drained group's sessions
    listing = await (await running.client.get(GROUPS, headers=AUTH)).json()
    assert [(g["revision"], g["state"]) for g in listing["groups"]] == [
        ("1", "active"), ("2", "draining")]

    gate.set()
    assert await held.read() == b"".join(chunks[1:])
    await wait_until(lambda: "2" not in running.router.registry.groups)
    listing = await (await running.client.get(GROUPS, headers=AUTH)).json()
    assert [g["revision"] for g in listing["groups"]] == ["1"]
    # Its gauges go; its counters stay, for rates over windows that saw it.
    scrape = (await (await running.client.get("/metrics")).text()).splitlines()
    assert not [line for line in scrape if 'revision="2"' in line and line.startswith(
        ("pdserve_router_backend_up", "pdserve_router_in_flight"))]
    assert [line for line in scrape if line.startswith(
        'pdserve_router_requests_total{endpoint="completions",revision="2"')]


async def test_a_drained_prefill_stays_open_until_decode_has_its_kv(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    # Decode's answer comes after a while: the KV prefill announced is pending meanwhile.
    decode.seconds_per_prompt_token = 0.05
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), admin_token=TOKEN,
                                 kv_channel="nixl")
    [member] = running.router.registry.primary.pools["prefill"].backends
    request = asyncio.create_task(running.client.post("/v1/completions", json=COMPLETION))
    await wait_until(lambda: member.kv_pending == 1)
    assert member.in_flight == 0
    listing = await (await running.client.get(GROUPS, headers=AUTH)).json()
    assert listing["groups"][0]["kv_pending"] == 1
    response = await running.client.delete("/admin/backends", headers=AUTH,
                                           params={"role": "prefill", "url": prefill.url})
    assert response.status == 202
    await asyncio.sleep(0.1)
    assert member.session is not None and not member.session.closed
    assert (await request).status == 200
    await wait_until(lambda: member.session is not None and member.session.closed)
    assert member.kv_pending == 0


async def test_kv_pending_is_released_by_a_failed_decode_too(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode.fail_with = (500, {"error": {"message": "KV load failure", "type": "x", "code": 500}})
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), kv_channel="nixl")
    response = await running.client.post("/v1/completions", json=COMPLETION)
    assert (await error_of(response, 502))["code"] == "kv_handoff_failed"
    assert running.router.registry.primary.pools["prefill"].backends[0].kv_pending == 0
    assert await running.metric("pdserve_router_handoff_failures_total", {"revision": "1"}) == 1


async def test_a_drain_waits_for_kv_leases_until_their_timeout() -> None:
    released, expired = Backend(url="http://127.0.0.1:1", role="prefill"), \
        Backend(url="http://127.0.0.1:2", role="prefill")
    lease = released.lease_kv()
    expired.lease_kv()
    draining = asyncio.create_task(released.drain(kv_lease_s=60))
    await asyncio.sleep(0.05)
    assert not draining.done()
    lease.release()
    lease.release()  # once only, whatever path the request takes
    await asyncio.wait_for(draining, timeout=1)
    assert released.kv_pending == 0
    # Never pulled: the worker frees the blocks itself after the lease, and so the drain ends.
    await asyncio.wait_for(expired.drain(kv_lease_s=0.05), timeout=1)
    assert expired.kv_pending == 1
