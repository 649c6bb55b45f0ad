"""The gateway (inference/gateway/): one endpoint that sends each request to the router of the
deployment its model names, relays the answer (streamed or whole), falls back along an alias's
targets, checks keys and their scope, and takes a new configuration at run time.

Stub routers stand in for the deployments' routers: they record what reached them and answer
JSON or SSE, or a 503, at the test's word. A refused connection is a closed port (``dead_url``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from inference.gateway.server import ADMIN_TOKEN_ENV
from inference.router.keys import key_hash, new_key, public_prefix
from tests.unit.conftest import wait_until
from tests.unit.gateway_stubs import (
    ADMIN,
    ADMIN_AUTH,
    StartGateway,
    StubRouter,
    bearer,
    configuration,
    deployment,
    key_entry,
    not_found,
)

REPO = Path(__file__).resolve().parents[2]
FALLBACKS = "pdserve_gateway_fallbacks_total"


# ---- routing and relaying ----------------------------------------------------------------

async def test_a_served_name_goes_to_its_deployment_with_the_body_unchanged(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a, b = await make_router("a"), await make_router("b")
    running = await start_gateway(configuration(deployment("a", a.url), deployment("b", b.url)))
    # Odd spacing and key order: the router must get these very bytes, not a re-serialisation.
    raw = b'{"prompt": "hi",   "model":"model-b", "max_tokens": 4, "temperature": 0.50}'
    headers = {"Content-Type": "application/json", "X-Request-Id": "req-42",
               "Authorization": "Bearer anything", "X-Pdserve-Session": "s1", "X-Other": "no"}
    response = await running.client.post("/v1/completions?trace=1", data=raw, headers=headers)

    assert response.status == 200
    assert await response.json() == {"from": "b", "model": "model-b"}
    assert response.headers["X-Pdserve-Deployment"] == "b"
    assert response.headers["X-Pdserve-Revision"] == "2"
    assert response.headers["X-Request-Id"] == "req-42"
    assert a.requests == []
    [seen] = b.requests
    assert seen.raw == raw and seen.path_qs == "/v1/completions?trace=1"
    assert seen.headers["Authorization"] == "Bearer anything"
    assert seen.headers["X-Pdserve-Session"] == "s1" and seen.headers["X-Request-Id"] == "req-42"
    assert "X-Other" not in seen.headers
    assert await running.metric("pdserve_gateway_requests_total",
                                {"model": "model-b", "deployment": "b", "status": "200"}) == 1

    # Without an X-Request-Id the gateway makes one, and the router sees the same.
    response = await running.client.post("/v1/chat/completions", json={"model": "model-a"})
    assert response.status == 200 and response.headers["X-Pdserve-Deployment"] == "a"
    assert len(a.requests[0].headers["X-Request-Id"]) == 32
    assert response.headers["X-Request-Id"] == a.requests[0].headers["X-Request-Id"]


async def test_a_stream_is_relayed_event_by_event_in_order(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a, b = await make_router("a"), await make_router("b")
    b.gate = asyncio.Event()
    running = await start_gateway(configuration(deployment("a", a.url), deployment("b", b.url)))
    # The router holds its second event until the first has reached the client: a gateway
    # that buffered the answer would never send even its headers.
    response = await asyncio.wait_for(running.client.post(
        "/v1/chat/completions", json={"model": "model-b", "stream": True}), timeout=5)
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["X-Pdserve-Deployment"] == "b"
    events = b.events()
    first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), timeout=5)
    assert first == events[0]
    b.gate.set()
    assert first + await response.content.read() == b"".join(events)
    assert a.requests == []


async def test_an_alias_rewrites_model_to_its_target(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a, b = await make_router("a"), await make_router("b")
    running = await start_gateway(configuration(deployment("a", a.url), deployment("b", b.url),
                                                aliases={"chat": ["b", "a"]}))
    request = {"model": "chat", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 3}
    response = await running.client.post("/v1/chat/completions", json=request)
    assert response.status == 200
    assert response.headers["X-Pdserve-Deployment"] == "b"
    assert b.requests[0].body == {**request, "model": "model-b"}
    assert a.requests == []


@pytest.mark.parametrize("fault", ["no_router", "refused", "http_503"])
async def test_an_alias_falls_back_to_its_next_target(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]],
        dead_url: str, fault: str) -> None:
    first, second = await make_router("first"), await make_router("second")
    router: str | None = {"no_router": None, "refused": dead_url, "http_503": first.url}[fault]
    if fault == "http_503":
        first.fail_with = 503
    running = await start_gateway(configuration(
        deployment("first", router), deployment("second", second.url),
        aliases={"chat": ["first", "second"]}))

    response = await running.client.post("/v1/chat/completions", json={"model": "chat", "stream": True})
    assert response.status == 200
    assert response.headers["X-Pdserve-Deployment"] == "second"
    assert await response.read() == b"".join(second.events())
    assert second.requests[0].body == {"model": "model-second", "stream": True}
    assert len(first.requests) == (1 if fault == "http_503" else 0)
    assert await running.metric(FALLBACKS, {"model": "chat", "from_deployment": "first",
                                            "to_deployment": "second"}) == 1


async def test_with_every_target_down_the_answer_names_each_reason(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]],
        dead_url: str) -> None:
    busy = await make_router("busy")
    busy.fail_with = 503
    running = await start_gateway(configuration(
        deployment("stopped", None), deployment("gone", dead_url), deployment("busy", busy.url),
        aliases={"chat": ["stopped", "gone"], "any": ["stopped", "busy"]}))

    response = await running.client.post("/v1/completions", json={"model": "chat"},
                                         headers={"X-Request-Id": "r-1"})
    assert response.status == 503
    assert response.headers["Retry-After"] == "5" and response.headers["X-Request-Id"] == "r-1"
    assert await response.json() == {"error": {
        "message": "no deployment of model 'chat' is running (stopped: router not running; "
                   "gone: connection refused)",
        "type": "InternalServerError", "param": "model", "code": "model_unavailable"}}
    assert await running.metric("pdserve_gateway_requests_total",
                                {"model": "chat", "deployment": "", "status": "503"}) == 1

    # A router that answered is relayed as it answered, rather than a 503 of the gateway's.
    response = await running.client.post("/v1/completions", json={"model": "any"})
    assert response.status == 503
    assert response.headers["Retry-After"] == "7"
    assert response.headers["X-Pdserve-Deployment"] == "busy"
    assert (await response.json())["error"]["code"] == "decode_unavailable"


async def test_a_router_that_breaks_off_its_answer_is_not_asked_again(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    # It had taken the request (its headers came): another deployment would run it twice.
    a, b = await make_router("a"), await make_router("b")
    a.dies = True
    running = await start_gateway(configuration(deployment("a", a.url), deployment("b", b.url),
                                                aliases={"chat": ["a", "b"]}))
    response = await running.client.post("/v1/completions", json={"model": "chat", "stream": True})
    assert response.status == 200
    text = (await response.read()).decode()
    first, error = text.split("\n\n")[:2]
    assert first == a.events()[0].decode().strip()
    assert json.loads(error.removeprefix("data: "))["error"]["code"] == "upstream_failed"

    response = await running.client.post("/v1/completions", json={"model": "chat"})
    assert response.status == 502
    assert response.headers["X-Pdserve-Deployment"] == "a"
    error = (await response.json())["error"]
    assert error["code"] == "upstream_failed" and "deployment a" in error["message"]
    assert b.requests == []


async def test_a_client_that_leaves_mid_stream_ends_the_router_call(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a = await make_router("a")
    a.endless = True
    running = await start_gateway(configuration(deployment("a", a.url)))
    response = await running.client.post("/v1/completions", json={"model": "model-a", "stream": True})
    await response.content.readuntil(b"\n\n")
    response.close()
    await wait_until(a.client_left.is_set)


async def test_a_path_cannot_climb_out_of_v1(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a = await make_router("a")
    running = await start_gateway(configuration(deployment("a", a.url)))
    response = await running.client.post(URL("/v1/%2e%2e/admin/keys", encoded=True),
                                         json={"model": "model-a"})
    assert response.status == 404
    assert (await running.client.post("/v1/models", json={"model": "model-a"})).status == 405
    assert a.requests == []


# ---- keys, scope and what clients are told -------------------------------------------------

async def test_unknown_and_forbidden_models_get_the_same_404(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a, b = await make_router("a"), await make_router("b")
    key = new_key()
    running = await start_gateway(configuration(
        deployment("a", a.url), deployment("b", b.url, team="ml"), aliases={"only-b": ["b"]},
        keys=(key_entry(key, 1, ["a"]),), require_key=True))
    answers = {}
    for model in ("model-b", "only-b", "no-such-model"):
        response = await running.client.post("/v1/chat/completions", json={"model": model},
                                             headers=bearer(key))
        assert response.status == 404
        answers[model] = await response.json()
    # Told apart by nothing but the name the client sent itself.
    assert answers == {model: not_found(model) for model in answers}
    assert b.requests == []
    response = await running.client.post("/v1/chat/completions", json={"model": "model-a"},
                                         headers=bearer(key))
    assert response.status == 200
    assert a.requests[0].headers["Authorization"] == f"Bearer {key}"


async def test_missing_wrong_and_revoked_keys_are_refused(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a = await make_router("a")
    good, revoked, unknown = new_key(), new_key(), new_key()
    running = await start_gateway(configuration(
        deployment("a", a.url),
        keys=(key_entry(good, 1, ["a"]), key_entry(revoked, 2, ["a"], state="revoked")),
        require_key=True))
    cases = [({}, "missing"), (bearer(unknown), "invalid"), (bearer(good + "x"), "invalid"),
             ({"Authorization": good}, "invalid"), (bearer("pds_short"), "invalid"),
             (bearer(revoked), "revoked")]
    for headers, reason in cases:
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models")):
            response = await running.client.request(method, path, json={"model": "model-a"},
                                                    headers=headers)
            assert response.status == 401, (headers, reason)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            error = (await response.json())["error"]
            assert error["code"] == "invalid_api_key" and error["type"] == "AuthenticationError"
            if reason == "revoked":
                assert "revoked" in error["message"] and public_prefix(revoked) in error["message"]
    assert await running.metric("pdserve_gateway_auth_failures_total", {"reason": "invalid"}) == 8
    assert await running.metric("pdserve_gateway_auth_failures_total", {"reason": "revoked"}) == 2
    assert a.requests == []
    ok = await running.client.post("/v1/completions", json={"model": "model-a"}, headers=bearer(good))
    assert ok.status == 200


async def test_the_model_list_shows_what_the_key_may_use(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    a = await make_router("a")
    narrow, wide = new_key(), new_key()
    config = configuration(
        deployment("a", a.url), deployment("b", None, team="ml", state="stopped"),
        aliases={"chat": ["b", "a"], "only-b": ["b"]},
        keys=(key_entry(narrow, 1, ["a"]), key_entry(wide, 2, ["a", "b"])), require_key=True)
    running = await start_gateway(config)
    model_a = {"id": "model-a", "object": "model", "created": 0, "owned_by": "default",
               "pdserve": {"deployment": "a", "state": "running"}}
    model_b = {"id": "model-b", "object": "model", "created": 0, "owned_by": "ml",
               "pdserve": {"deployment": "b", "state": "stopped"}}

    def alias(name: str, targets: list[str], state: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "pdserve",
                "pdserve": {"alias_of": targets, "state": state}}

    listed = await (await running.client.get("/v1/models", headers=bearer(narrow))).json()
    assert listed == {"object": "list", "data": [model_a, alias("chat", ["a"], "running")]}
    listed = await (await running.client.get("/v1/models", headers=bearer(wide))).json()
    assert listed["data"] == [model_a, model_b, alias("chat", ["b", "a"], "stopped"),
                              alias("only-b", ["b"], "stopped")]

    # Without required keys everyone sees everything.
    open_gateway = await start_gateway({**config, "require_key": False})
    listed = await (await open_gateway.client.get("/v1/models")).json()
    assert [m["id"] for m in listed["data"]] == ["model-a", "model-b", "chat", "only-b"]


async def test_open_deployments_take_anyone_closed_ones_a_key_of_theirs(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    # As the console describes deployments: each open or not as its own router is.
    shared, private = await make_router("shared"), await make_router("private")
    key = new_key()
    running = await start_gateway({
        "version": "v1",
        "deployments": [{**deployment("shared", shared.url), "require_key": False},
                        {**deployment("private", private.url), "require_key": True}],
        "aliases": [{"name": "chat", "targets": ["private", "shared"]}],
        "keys": [key_entry(key, 1, ["private"])]})
    client = running.client

    async def listed(headers: dict[str, str]) -> list[str]:
        response = await client.get("/v1/models", headers=headers)
        assert response.status == 200
        return [m["id"] for m in (await response.json())["data"]]

    assert await listed({}) == ["model-shared", "chat"]
    assert await listed(bearer(key)) == ["model-shared", "model-private", "chat"]
    # Without a key the alias goes to the open target only; with one, to its first.
    response = await client.post("/v1/completions", json={"model": "chat"})
    assert response.headers["X-Pdserve-Deployment"] == "shared"
    response = await client.post("/v1/completions", json={"model": "chat"}, headers=bearer(key))
    assert response.headers["X-Pdserve-Deployment"] == "private"
    # Sent without a key to a model that needs one: told so, as by its own router.
    response = await client.post("/v1/completions", json={"model": "model-private"})
    assert response.status == 401 and response.headers["WWW-Authenticate"] == "Bearer"
    assert (await response.json())["error"]["message"].startswith("missing API key")
    # A key of another deployment gets the 404 of a model that does not exist.
    other = new_key()
    applied = await client.put("/admin/config", headers=bearer(ADMIN), json={
        "version": "v2",
        "deployments": [{**deployment("shared", shared.url), "require_key": False},
                        {**deployment("private", private.url), "require_key": True},
                        {**deployment("third", None), "require_key": True}],
        "keys": [key_entry(key, 1, ["private"]), key_entry(other, 2, ["third"])]})
    assert applied.status == 200, await applied.text()
    response = await client.post("/v1/completions", json={"model": "model-private"},
                                 headers=bearer(other))
    assert response.status == 404 and await response.json() == not_found("model-private")
    # A key that is not one is refused, even for the open deployment.
    response = await client.post("/v1/completions", json={"model": "model-shared"},
                                 headers=bearer(new_key()))
    assert response.status == 401
    assert [len(shared.requests), len(private.requests)] == [1, 1]


@pytest.mark.parametrize(("raw", "param"), [
    (b"not json", "body"), (b"[1, 2]", "body"), (b'"model-a"', "body"),
    (b"{}", "model"), (b'{"model": 3}', "model"), (b'{"model": ["model-a"]}', "model"),
])
async def test_a_body_without_a_model_is_refused_naming_the_field(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]],
        raw: bytes, param: str) -> None:
    a = await make_router("a")
    running = await start_gateway(configuration(deployment("a", a.url)))
    response = await running.client.post("/v1/chat/completions", data=raw,
                                         headers={"Content-Type": "application/json"})
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == param and error["type"] == "BadRequestError"
    assert a.requests == []


async def test_health_before_any_configuration(start_gateway: StartGateway) -> None:
    running = await start_gateway()
    health = await (await running.client.get("/health")).json()
    assert health == {"status": "ok", "config_version": "", "deployments": 0, "aliases": 0}
    response = await running.client.post("/v1/completions", json={"model": "m"})
    assert response.status == 404 and await response.json() == not_found("m")


# ---- the admin API -----------------------------------------------------------------------

async def test_a_new_configuration_applies_whole_or_not_at_all(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.gateway")
    a, b = await make_router("a"), await make_router("b")
    key = new_key()
    running = await start_gateway(configuration(deployment("a", a.url), version="v1"))
    client = running.client

    # Valid up to its alias's second target: nothing of it may apply, not even the new deployment.
    bad = configuration(deployment("a", a.url), deployment("b", b.url),
                        aliases={"chat": ["b", "nope"]}, version="v2")
    response = await client.put("/admin/config", json=bad, headers=ADMIN_AUTH)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == "aliases[0].targets[1]" and "nope" in error["message"]
    assert (await client.post("/v1/completions", json={"model": "model-a"})).status == 200
    assert (await client.post("/v1/completions", json={"model": "model-b"})).status == 404
    assert (await (await client.get("/health")).json())["config_version"] == "v1"

    good = configuration(deployment("a", a.url), deployment("b", b.url),
                         aliases={"chat": ["b", "a"]}, keys=(key_entry(key, 7, ["b"]),), version="v2")
    response = await client.put("/admin/config", json=good, headers=ADMIN_AUTH)
    assert response.status == 200
    summary = {"version": "v2", "deployments": ["a", "b"], "aliases": ["chat"], "keys": 1}
    assert await response.json() == summary
    assert await (await client.get("/admin/config", headers=ADMIN_AUTH)).json() == summary
    response = await client.post("/v1/completions", json={"model": "chat"})
    assert response.headers["X-Pdserve-Deployment"] == "b"
    assert await running.metric("pdserve_gateway_config_info", {"version": "v2"}) == 1
    assert await running.metric("pdserve_gateway_config_info", {"version": "v1"}) == 0
    assert key_hash(key) not in caplog.text
    assert any("v2" in r.getMessage() and "2 deployments" in r.getMessage() for r in caplog.records)


async def test_the_admin_api_needs_its_token(start_gateway: StartGateway) -> None:
    running = await start_gateway(configuration(version="v1"))
    for headers in ({}, {"Authorization": f"Bearer {ADMIN}x"}, {"Authorization": ADMIN}):
        for method in ("GET", "PUT"):
            response = await running.client.request(method, "/admin/config", headers=headers,
                                                    json=configuration(version="v9"))
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert ADMIN not in await response.text()
    assert (await (await running.client.get("/health")).json())["config_version"] == "v1"

    disabled = await start_gateway(admin_token=None)
    for method in ("GET", "PUT"):
        response = await disabled.client.request(method, "/admin/config", headers=ADMIN_AUTH,
                                                 json=configuration())
        assert response.status == 403
        assert ADMIN_TOKEN_ENV in (await response.json())["error"]["message"]


# ---- the command line --------------------------------------------------------------------

def gateway_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inference.gateway", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_help_names_the_flags_and_the_token_variable() -> None:
    result = gateway_cli("--help")
    assert result.returncode == 0
    for word in ("--host", "--port", "--config-file", ADMIN_TOKEN_ENV):
        assert word in result.stdout


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "is not JSON"),
    (json.dumps({"deployments": [{"name": "a"}]}), "deployments[0].served_model_name"),
])
def test_a_bad_config_file_stops_the_start(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(text)
    result = gateway_cli("--port", "1", "--config-file", str(path))
    assert result.returncode != 0
    assert "--config-file" in result.stderr and words in result.stderr


async def test_one_served_name_of_several_deployments_reaches_those_the_key_opens(
        start_gateway: StartGateway, make_router: Callable[[str], Awaitable[StubRouter]]) -> None:
    # Two teams each serve their own "llama": one name, each key reaching its team's.
    ours, theirs = await make_router("ours"), await make_router("theirs")
    our_key, their_key = new_key(), new_key()
    running = await start_gateway({
        "version": "v1",
        "deployments": [{**deployment("ours", ours.url), "served_model_name": "llama",
                         "require_key": True},
                        {**deployment("theirs", theirs.url, team="other"),
                         "served_model_name": "llama", "require_key": True}],
        "keys": [key_entry(our_key, 1, ["ours"]), key_entry(their_key, 2, ["theirs"])]})
    for key, expected in ((our_key, "ours"), (their_key, "theirs")):
        response = await running.client.post("/v1/completions", headers=bearer(key),
                                             json={"model": "llama", "prompt": "hi"})
        assert response.status == 200 and response.headers["X-Pdserve-Deployment"] == expected
        listed = await (await running.client.get("/v1/models", headers=bearer(key))).json()
        assert [(m["id"], m["pdserve"]["deployment"]) for m in listed["data"]] == [
            ("llama", expected)]
    assert len(ours.requests) == len(theirs.requests) == 1
