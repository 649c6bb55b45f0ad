"""The router's admin token is read from its environment and never given back: not in --help,
a config dump or error, a log line, or any answer of the router's."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest

from inference.router.config import build_parser, config_from_args
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

TOKEN = "secret-admin-token-5f0c2b7e9a41d6"
ARGS = ["--served-model-name", "m", "--tokenizer", "/nonexistent", "--max-model-len", "64",
        "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]


def test_help_and_the_config_never_show_the_token(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PDSERVE_ROUTER_ADMIN_TOKEN", TOKEN)
    help_text = build_parser().format_help()
    assert "PDSERVE_ROUTER_ADMIN_TOKEN" in help_text and TOKEN not in help_text
    config = config_from_args(build_parser().parse_args(ARGS))
    assert config.admin_token == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in str(config)
    # The one check that compares it names the variables, not the value.
    monkeypatch.setenv("PDSERVE_API_KEY", TOKEN)
    with pytest.raises(ValueError) as refused:
        config_from_args(build_parser().parse_args(ARGS))
    assert TOKEN not in str(refused.value)


async def test_no_log_line_and_no_answer_holds_the_token(
        start_router: StartRouter, make_stub: MakeStub, dead_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,), admin_token=TOKEN)
    client = running.client
    admin = {"Authorization": f"Bearer {TOKEN}"}
    answers = [
        await client.get("/health"), await client.get("/metrics"), await client.get("/v1/models"),
        await client.post("/v1/completions", json={"model": MODEL, "prompt": "hello world"}),
        # A near miss and the token as an inference key: refused, without echoing it.
        await client.get("/admin/backends", headers={"Authorization": f"Bearer {TOKEN}x"}),
        await client.post("/v1/completions", headers=admin, json={"model": MODEL, "prompt": "hi"}),
        await client.get("/admin/backends", headers=admin),
        await client.post("/admin/backends", headers=admin, json={"role": "decode", "url": dead_url}),
        await client.delete("/admin/backends", headers=admin, params={"role": "decode", "url": dead_url}),
        await client.put("/admin/keys", headers=admin, json={"version": "v", "keys": []}),
        await client.put("/admin/keys", headers=admin, json={"keys": [{"id": 1}]}),
        await client.get("/admin/keys", headers=admin), await client.get("/admin/keys/usage", headers=admin),
    ]
    assert [a.status for a in answers] == [200, 200, 200, 200, 401, 200, 200, 201, 202, 200, 400, 200, 200]
    for answer in answers:
        assert TOKEN not in await answer.text(), answer.url
        assert not any(TOKEN in value for value in answer.headers.values()), answer.url
    # The stubs' records: the token is not passed on to the workers either.
    for request in [*prefill.requests, *decode.requests]:
        assert not any(TOKEN in value for value in request.headers.values())
    assert caplog.records, "nothing was logged: the check would prove nothing"
    for record in caplog.records:
        assert TOKEN not in record.getMessage(), record.getMessage()
