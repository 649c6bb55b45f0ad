"""Bad client input is refused by the router itself, with OpenAI-shaped errors, before any
worker is contacted; plus auth, request ids, /v1/models and /health."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientResponse

from inference.router.config import build_parser, config_from_args
from inference.router.errors import error_type
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GOOD_CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}]}
# What vLLM answers a body its request validation refuses.
VLLM_REFUSAL = {"error": {"message": "1 validation error: messages", "type": "BadRequestError",
                          "param": "messages", "code": 400}}


class PD:
    """A router in PD mode in front of one prefill and one decode stub."""

    def __init__(self, running: RunningRouter, prefill: StubVLLM, decode: StubVLLM):
        self.running = running
        self.client = running.client
        self.prefill = prefill
        self.decode = decode

    def backends_contacted(self) -> int:
        return len(self.prefill.requests) + len(self.decode.requests)


@pytest_asyncio.fixture(loop_scope="function")
async def make_pd(start_router: StartRouter, make_stub: MakeStub) -> Callable[..., Awaitable[PD]]:
    async def make(**overrides: Any) -> PD:
        prefill = await make_stub("prefill")
        decode = await make_stub("decode")
        running = await start_router(prefill=(prefill.url,), decode=(decode.url,), **overrides)
        return PD(running, prefill, decode)

    return make


@pytest_asyncio.fixture(loop_scope="function")
async def pd(make_pd: Callable[..., Awaitable[PD]]) -> PD:
    return await make_pd()


async def error_of(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert body["error"]["type"] == error_type(status)
    return body["error"]


async def test_malformed_json_is_400(pd: PD) -> None:
    response = await pd.client.post(CHAT, data=b'{"model": "tiny-test-model", "messages": [',
                                    headers={"Content-Type": "application/json"})
    error = await error_of(response, 400)
    assert "malformed JSON" in error["message"]
    assert pd.backends_contacted() == 0


async def test_json_that_is_not_an_object_is_decodes_to_refuse(pd: PD) -> None:
    pd.decode.fail_with = (400, VLLM_REFUSAL)
    response = await pd.client.post(CHAT, json=[GOOD_CHAT])
    assert response.status == 400
    assert await response.json() == VLLM_REFUSAL
    assert pd.prefill.requests == []


async def test_unknown_model_is_404_naming_the_model(pd: PD) -> None:
    response = await pd.client.post(CHAT, json={**GOOD_CHAT, "model": "gpt-imaginary"})
    error = await error_of(response, 404)
    assert "gpt-imaginary" in error["message"]
    assert error["param"] == "model"
    assert error["code"] == "model_not_found"
    assert pd.backends_contacted() == 0


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_a_request_without_a_model_is_served_by_the_served_model(pd: PD, path: str) -> None:
    # vLLM's own behaviour: the model field is optional and defaults to the served model.
    body = {"messages": GOOD_CHAT["messages"]} if path == CHAT else {"prompt": "hello"}
    response = await pd.client.post(path, json=body)
    assert response.status == 200, await response.text()


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        (CHAT, {"messages": "hello world"}),
        (CHAT, {"messages": {"role": "user", "content": "hello"}}),
        (CHAT, {"messages": []}),
        (CHAT, {"messages": ["hello"]}),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}, {"content": "no role"}]}),
        (CHAT, {"messages": [{"role": 7, "content": "hi"}]}),
        (CHAT, {"messages": [{"role": "user", "content": 42}]}),
        (CHAT, {"max_tokens": "5"}),
        # bool is an int subclass in Python; JSON true must not pass as max_tokens=1
        (CHAT, {"max_tokens": True}),
        (CHAT, {"max_completion_tokens": 2.5}),
        (CHAT, {"max_tokens": 0}),
        (COMPLETIONS, {"prompt": 5}),
        (COMPLETIONS, {"prompt": [1, "two"]}),
        (COMPLETIONS, {"prompt": []}),
    ],
)
async def test_what_the_router_cannot_read_is_vllms_to_refuse(pd: PD, path: str,
                                                              extra: dict[str, Any]) -> None:
    """The router refuses nothing a worker might take: a body it cannot make sense of goes
    whole to decode, unchanged, and decode's own answer (vLLM's 400 here) reaches the client."""
    base: dict[str, Any] = dict(GOOD_CHAT) if path == CHAT else {"model": MODEL, "prompt": "hello"}
    body = {**base, **extra}
    pd.decode.fail_with = (400, VLLM_REFUSAL)
    response = await pd.client.post(path, json=body)
    assert response.status == 400
    assert await response.json() == VLLM_REFUSAL
    assert pd.prefill.requests == []
    assert [r.body for r in pd.decode.requests] == [body]


@pytest.mark.parametrize("value", [[1], "maybe", 2, {}])
async def test_a_stream_flag_vllm_would_not_read_as_a_boolean_is_400(pd: PD, value: Any) -> None:
    error = await error_of(await pd.client.post(CHAT, json={**GOOD_CHAT, "stream": value}), 400)
    assert error["param"] == "stream"
    assert pd.backends_contacted() == 0


@pytest.mark.parametrize(("path", "extra", "reason"), [
    (CHAT, {"n": 2, "temperature": 1.0}, "several_sequences"),
    (COMPLETIONS, {"best_of": 3, "n": 2, "temperature": 1.0}, "several_sequences"),
    (COMPLETIONS, {"prompt": ["one", "two"]}, "batched_prompt"),
    (COMPLETIONS, {"prompt": [[1, 2, 3], [4, 5]]}, "batched_prompt"),
    (COMPLETIONS, {"echo": True, "logprobs": 1}, "prompt_logprobs"),
    (CHAT, {"prompt_logprobs": 1}, "prompt_logprobs"),
])
async def test_requests_a_kv_hand_off_cannot_serve_run_whole_on_decode(
        pd: PD, path: str, extra: dict[str, Any], reason: str) -> None:
    base: dict[str, Any] = dict(GOOD_CHAT) if path == CHAT else {"model": MODEL, "prompt": "hello"}
    response = await pd.client.post(path, json={**base, **extra})
    assert response.status == 200, await response.text()
    assert pd.prefill.requests == []
    assert [r.body for r in pd.decode.requests] == [{**base, **extra}]
    assert await pd.running.metric("pdserve_router_pd_fallback_total", {"reason": reason}) == 1


@pytest.mark.parametrize("stream", ["true", 1, "on"])
async def test_a_stream_flag_vllm_reads_as_true_streams(pd: PD, stream: Any) -> None:
    response = await pd.client.post(CHAT, json={**GOOD_CHAT, "stream": stream})
    assert response.status == 200
    assert response.content_type == "text/event-stream"
    assert b"data: [DONE]" in await response.read()


async def test_n_of_one_is_accepted(pd: PD) -> None:
    response = await pd.client.post(CHAT, json={**GOOD_CHAT, "n": 1})
    assert response.status == 200, await response.text()


async def test_body_over_max_body_bytes_is_413(make_pd: Callable[..., Awaitable[PD]]) -> None:
    pd = await make_pd(max_body_bytes=2048)
    padded = {**GOOD_CHAT, "user": "x" * 4096}
    error = await error_of(await pd.client.post(CHAT, json=padded), 413)
    assert "2048" in error["message"]
    assert pd.backends_contacted() == 0
    # A body just under the limit still goes through: the limit is on size, not on content.
    response = await pd.client.post(CHAT, json={**GOOD_CHAT, "user": "x" * 1024})
    assert response.status == 200, await response.text()


LONG_TEXT = " ".join(["the quick brown fox"] * 10)  # 40 words, one token each


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, {"prompt": LONG_TEXT}, "prompt"),
        (COMPLETIONS, {"prompt": list(range(3, 43))}, "prompt"),
        (CHAT, {"messages": [{"role": "user", "content": LONG_TEXT}]}, "messages"),
    ],
)
async def test_prompt_longer_than_max_model_len_is_400_before_any_backend(
        make_pd: Callable[..., Awaitable[PD]], path: str, body: dict[str, Any], param: str) -> None:
    pd = await make_pd(max_model_len=32)
    error = await error_of(await pd.client.post(path, json={"model": MODEL, **body}), 400)
    assert "32" in error["message"]
    assert error["param"] == param
    assert error["code"] == "context_length_exceeded"
    assert pd.backends_contacted() == 0


async def test_prompt_plus_max_tokens_over_the_limit_is_400_on_max_tokens(
        make_pd: Callable[..., Awaitable[PD]]) -> None:
    pd = await make_pd(max_model_len=32)
    short = {"model": MODEL, "prompt": "hello world"}  # 2 tokens, fits on its own
    error = await error_of(await pd.client.post(COMPLETIONS, json={**short, "max_tokens": 31}), 400)
    assert error["param"] == "max_tokens"
    assert "32" in error["message"]
    assert pd.backends_contacted() == 0
    response = await pd.client.post(COMPLETIONS, json={**short, "max_tokens": 30})
    assert response.status == 200, await response.text()


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-key", "s3cret-key", "Basic s3cret-key", "Bearer s3cret-key-and-more", "Bearer "],
)
async def test_missing_or_invalid_api_key_is_401(make_pd: Callable[..., Awaitable[PD]],
                                                 authorization: str | None) -> None:
    pd = await make_pd(api_key="s3cret-key")
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = await pd.client.post(CHAT, json=GOOD_CHAT, headers=headers)
    error = await error_of(response, 401)
    assert error["code"] == "invalid_api_key"
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert (await pd.client.get("/v1/models", headers=headers)).status == 401
    assert pd.backends_contacted() == 0


async def test_valid_api_key_passes(make_pd: Callable[..., Awaitable[PD]]) -> None:
    pd = await make_pd(api_key="s3cret-key")
    headers = {"Authorization": "Bearer s3cret-key"}
    response = await pd.client.post(CHAT, json=GOOD_CHAT, headers=headers)
    assert response.status == 200, await response.text()
    assert (await response.json())["choices"][0]["message"]["content"] == "decode"
    assert (await pd.client.get("/v1/models", headers=headers)).status == 200
    # The client's key is for the router; workers listen on loopback and must not receive it.
    for stub in (pd.prefill, pd.decode):
        assert [r.headers.get("Authorization") for r in stub.requests] == [None]


async def test_health_needs_no_api_key(make_pd: Callable[..., Awaitable[PD]]) -> None:
    # Load balancers and the supervisor probe /health without credentials.
    pd = await make_pd(api_key="s3cret-key")
    assert (await pd.client.get("/health")).status == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_request_id_is_propagated_to_backends_and_returned(pd: PD, stream: bool) -> None:
    response = await pd.client.post(CHAT, json={**GOOD_CHAT, "stream": stream},
                                    headers={"X-Request-Id": "req-client-42"})
    assert response.status == 200, await response.text()
    await response.read()
    assert response.headers["X-Request-Id"] == "req-client-42"
    assert [r.headers["X-Request-Id"] for r in pd.prefill.requests] == ["req-client-42"]
    assert [r.headers["X-Request-Id"] for r in pd.decode.requests] == ["req-client-42"]


async def test_request_id_is_generated_when_absent(pd: PD) -> None:
    first = await pd.client.post(CHAT, json=GOOD_CHAT)
    second = await pd.client.post(CHAT, json=GOOD_CHAT)
    ids = [first.headers.get("X-Request-Id"), second.headers.get("X-Request-Id")]
    assert all(ids) and ids[0] != ids[1]
    # One id follows a request through both hops, so logs can be joined across workers.
    assert [r.headers["X-Request-Id"] for r in pd.prefill.requests] == ids
    assert [r.headers["X-Request-Id"] for r in pd.decode.requests] == ids


async def test_request_id_is_returned_on_errors_too(pd: PD) -> None:
    response = await pd.client.post(CHAT, data=b"not json", headers={"X-Request-Id": "req-bad"})
    assert response.status == 400
    assert response.headers["X-Request-Id"] == "req-bad"


async def test_models_lists_the_served_model(pd: PD) -> None:
    response = await pd.client.get("/v1/models")
    assert response.status == 200
    body = await response.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [(MODEL, "model", 64)]


@pytest.mark.parametrize(("degraded_mode", "status", "state"),
                         [(True, 200, "degraded"), (False, 503, "unavailable")])
async def test_health_with_decode_down_is_degraded_or_with_the_switch_off_unavailable(
        start_router: Callable[..., Awaitable[RunningRouter]], make_stub: MakeStub,
        dead_url: str, degraded_mode: bool, status: int, state: str) -> None:
    prefill = await make_stub("prefill")
    running = await start_router(prefill=(prefill.url,), decode=(dead_url,), wait_ready=False,
                                 degraded_mode=degraded_mode)
    router = running.router
    # Wait for a completed probe round, so "not ready" is a verdict rather than the initial state.
    await wait_until(lambda: bool(router.registry.primary.pools["prefill"].ready())
                     and bool(router.registry.primary.pools["decode"].backends[0].last_error))
    response = await running.client.get("/health")
    assert response.status == status
    body = await response.json()
    assert body["status"] == state
    assert body.get("degraded") == ("decode" if degraded_mode else None)
    assert body["mode"] == "pd"
    assert body["roles"]["prefill"]["ready"] == 1
    assert body["roles"]["prefill"]["total"] == 1
    assert body["roles"]["decode"]["ready"] == 0
    decode_backend = body["roles"]["decode"]["backends"][0]
    assert decode_backend["url"] == dead_url
    assert decode_backend["ready"] is False
    assert decode_backend["error"]


async def test_health_is_200_when_both_roles_are_ready(pd: PD) -> None:
    response = await pd.client.get("/health")
    assert response.status == 200
    body = await response.json()
    assert body["status"] == "ok"
    assert {role: info["ready"] for role, info in body["roles"].items()} == {"prefill": 1, "decode": 1}


async def test_rejected_requests_are_counted_by_status(pd: PD) -> None:
    await pd.client.post(CHAT, json={**GOOD_CHAT, "model": "nope"})
    await pd.client.post(CHAT, json=GOOD_CHAT)
    labels = {"endpoint": "chat", "status": "404", "role": "none"}
    assert await pd.running.metric("pdserve_router_requests_total", labels) == 1
    labels = {"endpoint": "chat", "status": "200", "role": "prefill+decode"}
    assert await pd.running.metric("pdserve_router_requests_total", labels) == 1
    # The router's own time and the hand-off time of the one answered request.
    assert await pd.running.metric("pdserve_router_added_seconds_count", {}) == 1
    assert 0 < await pd.running.metric("pdserve_router_added_seconds_sum", {}) < 0.5
    assert await pd.running.metric("pdserve_router_kv_handoff_seconds_count", {}) == 1


def test_cli_config_reads_the_api_key_from_the_environment_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_API_KEY", "from-env")
    args = build_parser().parse_args([
        "--served-model-name", MODEL, "--tokenizer", "/models/x", "--max-model-len", "128",
        "--prefill", "http://127.0.0.1:8100/", "--decode", "http://127.0.0.1:8200",
    ])
    config = config_from_args(args)
    assert config.api_key == "from-env"
    assert config.prefill_urls == ("http://127.0.0.1:8100",)
    # repr ends up in logs; the key must not.
    assert "from-env" not in repr(config)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--prefill", "http://a", "--decode", "http://b", "--colocated", "http://c"], "--colocated"),
        (["--prefill", "http://a"], "--decode"),
        (["--colocated", "http://c", "--port", "0"], "--port"),
    ],
)
def test_cli_config_rejects_inconsistent_settings(argv: list[str], flag: str) -> None:
    args = build_parser().parse_args(
        ["--served-model-name", MODEL, "--tokenizer", "/m", "--max-model-len", "128", *argv])
    with pytest.raises(ValueError, match=flag):
        config_from_args(args)


def test_error_bodies_are_openai_shaped() -> None:
    # Clients such as the openai SDK read error.message / error.code; keep the shape stable.
    from inference.router.errors import RequestError

    body = RequestError(400, "bad", param="messages", code="x").body()
    assert json.loads(json.dumps(body)) == {
        "error": {"message": "bad", "type": "BadRequestError", "param": "messages", "code": "x"}
    }
