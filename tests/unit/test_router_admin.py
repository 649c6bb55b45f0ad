"""The admin API: pool members added and removed at run time, behind their own token; a removed
member is drained, never cut off mid-stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse

from inference.router.backends import probe
from inference.router.config import RouterConfig, build_parser, config_from_args
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

TOKEN = "admin-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PATH = "/admin/backends"
COMPLETION = {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4}


async def pd(start_router: StartRouter, make_stub: MakeStub,
             **overrides: Any) -> tuple[RunningRouter, StubVLLM, StubVLLM]:
    prefill = await make_stub("prefill")
    decode = await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 **{"admin_token": TOKEN, **overrides})
    return running, prefill, decode


async def error_of(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    return (await response.json())["error"]


# ---- switched off, and auth ---------------------------------------------------------------------

async def test_without_a_token_the_admin_api_is_404(start_router: StartRouter,
                                                    make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd(start_router, make_stub, admin_token=None)
    for method, kwargs in (("GET", {}), ("POST", {"json": {"role": "decode", "url": decode.url}}),
                           ("DELETE", {"params": {"role": "decode", "url": decode.url}})):
        response = await running.client.request(method, PATH, headers=AUTH, **kwargs)
        assert (await error_of(response, 404))["code"] == "admin_disabled"
    assert len(running.router.registry.primary.pools["decode"].backends) == 1


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", TOKEN, "Bearer inference-key"])
async def test_a_missing_or_wrong_admin_token_is_401(start_router: StartRouter, make_stub: MakeStub,
                                                     authorization: str | None) -> None:
    running, _prefill, decode = await pd(start_router, make_stub, api_key="inference-key")
    headers = {"Authorization": authorization} if authorization else {}
    for method, kwargs in (("GET", {}), ("POST", {"json": {"role": "decode", "url": "http://x:1"}}),
                           ("DELETE", {"params": {"role": "decode", "url": decode.url}})):
        response = await running.client.request(method, PATH, headers=headers, **kwargs)
        assert (await error_of(response, 401))["code"] == "invalid_admin_token"
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert [b.url for b in running.router.registry.primary.pools["decode"].backends] == [decode.url]


def test_the_admin_token_comes_from_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_ROUTER_ADMIN_TOKEN", "from-env")
    args = build_parser().parse_args(["--served-model-name", MODEL, "--tokenizer", "/m",
                                      "--max-model-len", "128", "--prefill", "http://a:1",
                                      "--decode", "http://b:2"])
    config = config_from_args(args)
    assert config.admin_token == "from-env"
    assert "from-env" not in repr(config)


def test_the_admin_token_must_differ_from_the_inference_key() -> None:
    config = RouterConfig(served_model_name=MODEL, tokenizer_path="/m", max_model_len=128,
                          prefill_urls=("http://a:1",), decode_urls=("http://b:2",),
                          api_key="same", admin_token="same")
    with pytest.raises(ValueError, match="PDSERVE_ROUTER_ADMIN_TOKEN"):
        config.validate()


# ---- listing, adding, removing ------------------------------------------------------------------

async def test_get_lists_every_role_with_its_policy_and_members(start_router: StartRouter,
                                                               make_stub: MakeStub) -> None:
    running, prefill, decode = await pd(start_router, make_stub, prefill_policy="prefix_aware")
    response = await running.client.get(PATH, headers=AUTH)
    assert response.status == 200
    body = await response.json()
    assert body["mode"] == "pd"
    assert body["roles"]["prefill"]["policy"] == "prefix_aware"
    assert body["roles"]["decode"]["policy"] == "least_outstanding"
    assert body["roles"]["prefill"]["backends"] == [
        {"role": "prefill", "url": prefill.url, "state": "ready", "in_flight": 0, "error": "",
         "revision": "1"}]
    assert [b["url"] for b in body["roles"]["decode"]["backends"]] == [decode.url]


async def test_an_added_backend_takes_requests_at_once(start_router: StartRouter,
                                                      make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd(start_router, make_stub)
    second = await make_stub("decode-2")
    response = await running.client.post(PATH, headers=AUTH,
                                         json={"role": "decode", "url": second.url + "/"})
    assert response.status == 201, await response.text()
    # Probed while adding: ready in the answer, no wait for the next probe round.
    assert await response.json() == {"role": "decode", "url": second.url, "state": "ready",
                                     "in_flight": 0, "error": ""}
    for _ in range(4):
        assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200
    assert (len(decode.requests), len(second.requests)) == (2, 2)
    health = await (await running.client.get("/health")).json()
    assert health["roles"]["decode"]["ready"] == 2


async def test_an_unreachable_backend_is_added_but_not_used(start_router: StartRouter,
                                                           make_stub: MakeStub,
                                                           dead_url: str) -> None:
    running, _prefill, decode = await pd(start_router, make_stub)
    response = await running.client.post(PATH, headers=AUTH, json={"role": "decode", "url": dead_url})
    assert response.status == 201
    body = await response.json()
    assert body["state"] == "not_ready" and body["error"]
    for _ in range(2):
        assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200
    assert len(decode.requests) == 2


async def test_a_removed_backend_takes_no_more_requests(start_router: StartRouter,
                                                       make_stub: MakeStub) -> None:
    prefill = await make_stub("prefill")
    decodes = [await make_stub("decode-a"), await make_stub("decode-b")]
    running = await start_router(prefill=(prefill.url,), decode=tuple(d.url for d in decodes),
                                 admin_token=TOKEN)
    response = await running.client.delete(PATH, headers=AUTH,
                                           params={"role": "decode", "url": decodes[0].url})
    assert response.status == 202, await response.text()
    assert (await response.json())["state"] == "draining"
    for _ in range(3):
        assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200
    assert [len(d.requests) for d in decodes] == [0, 3]
    # Idle, so closed at once: gone from the listing and from the metrics.
    await wait_until(lambda: not running.router.registry.primary.pools["decode"].draining)
    listing = await (await running.client.get(PATH, headers=AUTH)).json()
    assert [b["url"] for b in listing["roles"]["decode"]["backends"]] == [decodes[1].url]
    scrape = await (await running.client.get("/metrics")).text()
    assert decodes[0].url not in scrape


async def test_a_removed_backend_finishes_its_stream_before_it_is_closed(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    prefill = await make_stub("prefill")
    decodes = [await make_stub("decode-a"), await make_stub("decode-b")]
    gate = asyncio.Event()
    decodes[0].stream_gate = gate
    running = await start_router(prefill=(prefill.url,), decode=tuple(d.url for d in decodes),
                                 admin_token=TOKEN)
    held = await running.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert held.status == 200
    chunks = decodes[0].sse_chunks("completions")
    assert await asyncio.wait_for(held.content.readuntil(b"\n\n"), timeout=3) == chunks[0]
    removed = running.router.registry.primary.pools["decode"].backends[0]

    response = await running.client.delete(PATH, headers=AUTH,
                                           params={"role": "decode", "url": decodes[0].url})
    assert response.status == 202
    assert (await response.json())["in_flight"] == 1
    # Out of the pool: the next request goes to the other member.
    assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200
    assert len(decodes[1].requests) == 1
    listing = await (await running.client.get(PATH, headers=AUTH)).json()
    assert {b["url"]: b["state"] for b in listing["roles"]["decode"]["backends"]} == {
        decodes[0].url: "draining", decodes[1].url: "ready"}
    await asyncio.sleep(0.3)  # several probe rounds: none may touch or close the drained session
    assert removed.session is not None and not removed.session.closed

    gate.set()
    assert await held.read() == b"".join(chunks[1:])
    await wait_until(lambda: not running.router.registry.primary.pools["decode"].draining)
    assert removed.session is not None and removed.session.closed


async def test_a_url_can_be_added_again_while_its_old_member_drains(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd(start_router, make_stub)
    gate = asyncio.Event()
    decode.stream_gate = gate
    held = await running.client.post("/v1/completions", json={**COMPLETION, "stream": True})
    await asyncio.wait_for(held.content.readuntil(b"\n\n"), timeout=3)
    params = {"role": "decode", "url": decode.url}
    assert (await running.client.delete(PATH, headers=AUTH, params=params)).status == 202
    assert (await running.client.post(PATH, headers=AUTH, json=params)).status == 201
    gate.set()
    await held.read()
    await wait_until(lambda: not running.router.registry.primary.pools["decode"].draining)
    # The old member's drain must not have dropped the new one's series.
    scrape = await (await running.client.get("/metrics")).text()
    assert (f'pdserve_router_backend_up{{backend="{decode.url}",revision="1",role="decode"}} 1.0'
            in scrape)
    assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"url": "http://127.0.0.1:9"}, "role"),
        ({"role": 3, "url": "http://127.0.0.1:9"}, "role"),
        ({"role": "colocated", "url": "http://127.0.0.1:9"}, "role"),
        ({"role": "decode"}, "url"),
        ({"role": "decode", "url": 8100}, "url"),
        ({"role": "decode", "url": "127.0.0.1:8100"}, "url"),
        ({"role": "decode", "url": "ftp://127.0.0.1:8100"}, "url"),
        ({"role": "decode", "url": "http://127.0.0.1:8100/v1"}, "url"),
        ({"role": "decode", "url": "http://127.0.0.1:8100?x=1"}, "url"),
        ({"role": "decode", "url": "http://user:pw@127.0.0.1:8100"}, "url"),
        ({"role": "decode", "url": "http://127.0.0.1:99999"}, "url"),
    ],
)
async def test_bad_additions_are_400_naming_the_field(start_router: StartRouter, make_stub: MakeStub,
                                                      body: dict[str, Any], param: str) -> None:
    running, _prefill, _decode = await pd(start_router, make_stub)
    error = await error_of(await running.client.post(PATH, headers=AUTH, json=body), 400)
    assert error["param"] == param
    assert f"'{param}'" in error["message"]
    assert len(running.router.registry.primary.pools["decode"].backends) == 1


@pytest.mark.parametrize("raw", [b"{not json", b'["decode"]'])
async def test_a_body_that_is_no_json_object_is_400(start_router: StartRouter, make_stub: MakeStub,
                                                   raw: bytes) -> None:
    running, _prefill, _decode = await pd(start_router, make_stub)
    response = await running.client.post(PATH, headers={**AUTH, "Content-Type": "application/json"},
                                         data=raw)
    await error_of(response, 400)


async def test_adding_a_member_twice_is_409(start_router: StartRouter, make_stub: MakeStub) -> None:
    running, _prefill, decode = await pd(start_router, make_stub)
    response = await running.client.post(PATH, headers=AUTH, json={"role": "decode", "url": decode.url})
    error = await error_of(response, 409)
    assert error["param"] == "url" and error["code"] == "backend_exists"
    assert len(running.router.registry.primary.pools["decode"].backends) == 1


@pytest.mark.parametrize(
    ("params", "param"),
    [({"url": "http://127.0.0.1:9"}, "role"), ({"role": "router", "url": "http://127.0.0.1:9"}, "role"),
     ({"role": "decode"}, "url")],
)
async def test_bad_removals_are_400_naming_the_field(start_router: StartRouter, make_stub: MakeStub,
                                                     params: dict[str, str], param: str) -> None:
    running, _prefill, _decode = await pd(start_router, make_stub)
    error = await error_of(await running.client.delete(PATH, headers=AUTH, params=params), 400)
    assert error["param"] == param


async def test_removing_an_unknown_backend_is_404(start_router: StartRouter,
                                                 make_stub: MakeStub) -> None:
    running, prefill, _decode = await pd(start_router, make_stub)
    # A prefill member is not a decode member.
    response = await running.client.delete(PATH, headers=AUTH,
                                           params={"role": "decode", "url": prefill.url})
    error = await error_of(response, 404)
    assert error["code"] == "backend_not_found" and prefill.url in error["message"]
    assert len(running.router.registry.primary.pools["prefill"].backends) == 1


async def test_a_probe_of_a_drained_backend_is_a_no_op(start_router: StartRouter,
                                                      make_stub: MakeStub) -> None:
    # A probe round collects its members before it runs; one removed meanwhile has a closed
    # session, and probing it must neither raise (that would end the probe loop) nor touch it.
    running, _prefill, decode = await pd(start_router, make_stub)
    [member] = running.router.registry.primary.pools["decode"].backends
    running.router.registry.remove_backend("decode", decode.url)
    await wait_until(lambda: member.session is not None and member.session.closed)
    await probe(member, timeout_s=0.5)
    assert member.healthy and member.last_error == ""
