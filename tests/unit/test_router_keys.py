"""Inference API keys in the router: the key file at start, 401 for missing, invalid, revoked and
out-of-scope keys, a new key set through the admin API without a restart, usage reports, the
legacy single key, and the official openai client with a key."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from inference.router.config import build_parser, config_from_args
from inference.router.keys import key_hash, new_key, public_prefix
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

ADMIN = "admin-token"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
COMPLETION = {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 4}
AUTH_FAILURES = "pdserve_router_auth_failures_total"


def entry(key: str, key_id: int, state: str = "active", **limits: int) -> dict[str, Any]:
    return {"id": key_id, "prefix": public_prefix(key), "hash": key_hash(key), "state": state,
            "limits": limits}


def key_set(*entries: dict[str, Any], require_key: bool = True, version: str = "v1") -> dict[str, Any]:
    return {"version": version, "require_key": require_key, "keys": list(entries)}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def colocated(start_router: StartRouter, make_stub: MakeStub, tmp_path: Path,
                    keys: dict[str, Any], **overrides: Any) -> RunningRouter:
    worker = await make_stub("worker")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(keys))
    return await start_router(colocated=(worker.url,), keys_file=str(path), admin_token=ADMIN,
                              **overrides)


async def test_the_key_file_read_at_start_decides_who_gets_in(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    good, revoked, other, unknown = new_key(), new_key(), new_key(), new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(
        entry(good, 1), entry(revoked, 2, state="revoked"), entry(other, 3, state="out_of_scope")))
    client = running.client

    assert (await client.post("/v1/completions", json=COMPLETION, headers=bearer(good))).status == 200
    assert (await client.get("/v1/models", headers=bearer(good))).status == 200
    cases = [({}, "missing"), (bearer(unknown), "invalid"), (bearer(good + "x"), "invalid"),
             ({"Authorization": good}, "invalid"), (bearer(revoked), "revoked"),
             (bearer(other), "out_of_scope")]
    for headers, reason in cases:
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models")):
            response = await client.request(method, path, json=COMPLETION, headers=headers)
            assert response.status == 401, (headers, reason)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            error = (await response.json())["error"]
            assert error["code"] == "invalid_api_key"
        assert await running.metric(AUTH_FAILURES, {"reason": reason}) >= 2
    body = (await (await client.get("/v1/models", headers=bearer(revoked))).json())["error"]
    assert "revoked" in body["message"] and public_prefix(revoked) in body["message"]


async def test_without_required_keys_the_router_stays_open(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    # What a deployment with no key of its own gets: any or no Authorization passes, and a
    # valid key still counts against its limits.
    limited = new_key()
    running = await colocated(start_router, make_stub, tmp_path,
                              key_set(entry(limited, 1, requests_per_minute=1), require_key=False))
    for headers in ({}, bearer("EMPTY"), bearer(new_key())):
        assert (await running.client.post("/v1/completions", json=COMPLETION,
                                          headers=headers)).status == 200
    assert (await running.client.post("/v1/completions", json=COMPLETION,
                                      headers=bearer(limited))).status == 200
    assert (await running.client.post("/v1/completions", json=COMPLETION,
                                      headers=bearer(limited))).status == 429


async def test_a_new_key_set_applies_from_the_next_request_without_a_restart(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    first, second = new_key(), new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(entry(first, 1)))
    client = running.client
    assert (await client.post("/v1/completions", json=COMPLETION, headers=bearer(first))).status == 200

    response = await client.put("/admin/keys", headers=ADMIN_AUTH, json=key_set(
        entry(first, 1, state="revoked"), entry(second, 2), version="v2"))
    assert response.status == 200, await response.text()
    assert await response.json() == {"version": "v2", "keys": 2, "open": False}
    assert (await client.post("/v1/completions", json=COMPLETION, headers=bearer(first))).status == 401
    assert (await client.post("/v1/completions", json=COMPLETION, headers=bearer(second))).status == 200

    listed = await (await client.get("/admin/keys", headers=ADMIN_AUTH)).json()
    assert listed["version"] == "v2"
    assert {k["prefix"]: k["state"] for k in listed["keys"]} == {
        public_prefix(first): "revoked", public_prefix(second): "active"}
    assert "hash" not in json.dumps(listed)


async def test_usage_reports_last_use_and_counts_per_key(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    used, idle = new_key(), new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(entry(used, 7), entry(idle, 8)))
    for _ in range(3):
        await running.client.post("/v1/completions", json=COMPLETION, headers=bearer(used))
    usage = await (await running.client.get("/admin/keys/usage", headers=ADMIN_AUTH)).json()
    assert usage["version"] == "v1"
    assert usage["keys"]["7"]["requests"] == 3 and usage["keys"]["7"]["last_used"] > 0
    assert usage["keys"]["8"] == {"last_used": None, "requests": 0, "rate_limited": 0,
                                  "prompt_tokens": 0, "generated_tokens": 0}
    assert await running.metric("pdserve_router_key_requests_total",
                                {"key": f"pds_{public_prefix(used)}"}) == 3

    # A push that keeps the key keeps its counts.
    await running.client.put("/admin/keys", headers=ADMIN_AUTH,
                             json=key_set(entry(used, 7), version="v2"))
    usage = await (await running.client.get("/admin/keys/usage", headers=ADMIN_AUTH)).json()
    assert usage["keys"]["7"]["requests"] == 3 and set(usage["keys"]) == {"7"}


@pytest.mark.parametrize("body, param", [
    ([], "keys"),
    ({"keys": "x"}, "keys"),
    ({"keys": [{"id": 1, "prefix": "short", "hash": "0" * 64}]}, "keys[0].prefix"),
    ({"keys": [{"id": 1, "prefix": "abcdef12", "hash": "nothex"}]}, "keys[0].hash"),
    ({"keys": [{"id": 1, "prefix": "abcdef12", "hash": "0" * 64, "state": "on"}]}, "keys[0].state"),
    ({"keys": [{"id": 1, "prefix": "abcdef12", "hash": "0" * 64,
                "limits": {"requests_per_minute": 0}}]}, "keys[0].limits.requests_per_minute"),
    ({"keys": [{"id": 1, "prefix": "abcdef12", "hash": "0" * 64,
                "limits": {"tokens": 5}}]}, "keys[0].limits.tokens"),
    ({"keys": [], "require_key": "yes"}, "require_key"),
])
async def test_a_bad_key_set_is_400_naming_the_field_and_changes_nothing(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, body: Any, param: str) -> None:
    key = new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(entry(key, 1)))
    response = await running.client.put("/admin/keys", headers=ADMIN_AUTH, json=body)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == param
    assert (await running.client.post("/v1/completions", json=COMPLETION, headers=bearer(key))).status == 200


async def test_the_keys_admin_api_needs_the_admin_token_not_an_inference_key(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    key = new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(entry(key, 1)))
    for headers in ({}, bearer(key)):
        for method, path in (("GET", "/admin/keys"), ("PUT", "/admin/keys"),
                             ("GET", "/admin/keys/usage")):
            response = await running.client.request(method, path, headers=headers, json=key_set())
            assert response.status == 401
    assert (await running.client.post("/v1/completions", json=COMPLETION, headers=bearer(key))).status == 200


async def test_the_legacy_single_key_still_works_beside_console_keys(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    key = new_key()
    running = await colocated(start_router, make_stub, tmp_path, key_set(entry(key, 1)),
                              api_key="operator-key")
    for headers, status in ((bearer("operator-key"), 200), (bearer(key), 200), (bearer("nope"), 401),
                            ({}, 401)):
        assert (await running.client.post("/v1/completions", json=COMPLETION,
                                          headers=headers)).status == status


def test_a_bad_key_file_is_a_cli_error_naming_the_flag(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from inference.router.server import main

    bad = tmp_path / "keys.json"
    bad.write_text('{"keys": [{"id": 1}]}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SystemExit) as exited:
            main(["--served-model-name", MODEL, "--tokenizer", "/m", "--max-model-len", "64",
                  "--colocated", "http://127.0.0.1:1", "--keys-file", str(path)])
        assert exited.value.code == 2
        assert "--keys-file" in capsys.readouterr().err


def test_redis_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    args = build_parser().parse_args(["--served-model-name", MODEL, "--tokenizer", "/m",
                                      "--max-model-len", "64", "--colocated", "http://a:1"])
    config = config_from_args(args)
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert "6379" not in repr(config)


async def test_the_official_openai_client_works_with_a_key(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    key = new_key()
    running = await colocated(start_router, make_stub, tmp_path,
                              key_set(entry(key, 1, requests_per_minute=100,
                                            generated_tokens_per_minute=1000, max_concurrency=2)))
    base_url = str(running.client.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello world"}], max_tokens=4)
        assert chat.choices[0].message.content == "worker"
        stream = await client.completions.create(model=MODEL, prompt="hello world", max_tokens=4,
                                                 stream=True)
        text = "".join([chunk.choices[0].text async for chunk in stream])
        assert text == "".join(f"worker-{i} " for i in range(4))
    async with openai.AsyncOpenAI(base_url=base_url, api_key=new_key(), max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
