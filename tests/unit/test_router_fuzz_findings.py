"""What fuzzing the router found (tests/unit/test_router_fuzz.py), one regression test each:
every case used to be answered with a 500 or in aiohttp's plain-text shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientResponse

from inference.router.errors import RequestError, error_type
from inference.router.prompts import PromptChecker
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

ADMIN_TOKEN = "findings-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BODY_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
               ("POST", "/admin/backends"), ("PUT", "/admin/keys")]


@pytest_asyncio.fixture(loop_scope="function")
async def pd(start_router: StartRouter, make_stub: MakeStub) -> RunningRouter:
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    return await start_router(prefill=(prefill.url,), decode=(decode.url,), admin_token=ADMIN_TOKEN)


async def error_of(response: ClientResponse, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == error_type(status)
    return body["error"]


async def test_an_unknown_path_is_404_in_openai_shape(pd: RunningRouter) -> None:
    error = await error_of(await pd.client.get("/v1/embeddings"), 404)
    assert "/v1/embeddings" in error["message"]


async def test_a_wrong_method_is_405_naming_the_allowed_one(pd: RunningRouter) -> None:
    response = await pd.client.get("/v1/completions")
    error = await error_of(response, 405)
    assert response.headers["Allow"] == "POST"
    assert "POST" in error["message"]


async def test_an_admin_body_over_the_limit_is_413_in_openai_shape(pd: RunningRouter) -> None:
    response = await pd.client.put("/admin/keys", data=b" " * (4 * 1024 * 1024 + 1), headers=ADMIN)
    await error_of(response, 413)


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
async def test_an_integer_of_5000_digits_is_400(pd: RunningRouter, method: str, path: str) -> None:
    body = b'{"model": "%s", "max_tokens": %s}' % (MODEL.encode(), b"9" * 5000)
    error = await error_of(await pd.client.request(method, path, data=body, headers=ADMIN), 400)
    assert "malformed JSON" in error["message"]


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize("depth", [65, 950, 5000])
async def test_a_deeply_nested_body_is_400(pd: RunningRouter, method: str, path: str,
                                           depth: int) -> None:
    # 950 parses, but the router's second serialization for prefill, deeper in the stack, did not.
    body = b'{"model": "%s", "prompt": "hello", "user": %s}' % (
        MODEL.encode(), b"[" * depth + b"]" * depth)
    error = await error_of(await pd.client.request(method, path, data=body, headers=ADMIN), 400)
    assert "nested deeper than 64 levels" in error["message"]


async def test_a_body_nested_64_deep_is_served(pd: RunningRouter) -> None:
    body = b'{"model": "%s", "prompt": "hello", "user": %s}' % (MODEL.encode(), b"[" * 63 + b"]" * 63)
    response = await pd.client.post("/v1/completions", data=body)
    assert response.status == 200, await response.text()


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hello \ud800"}, "prompt"),
    ("/v1/completions", {"prompt": ["\udfff"]}, "prompt[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \udc00"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "us\ud800er", "content": "hi"}]}, "messages[0].role"),
])
async def test_a_lone_surrogate_in_the_prompt_is_400_naming_the_field(
        pd: RunningRouter, path: str, body: dict[str, Any], param: str) -> None:
    # json.dumps writes lone surrogates as \\udXXX escapes, which JSON allows and the tokenizer refuses.
    response = await pd.client.post(path, json={"model": MODEL, **body})
    error = await error_of(response, 400)
    assert error["param"] == param
    assert "surrogate" in error["message"]


def test_a_lone_surrogate_a_template_renders_from_content_parts_is_400(tokenizer_dir: Path) -> None:
    # Content parts reach the template as they are, so the rendered prompt is checked as well.
    checker = PromptChecker(str(tokenizer_dir), MODEL, 64)
    checker.tokenizer.chat_template = (
        "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}")
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}
    with pytest.raises(RequestError) as refused:
        checker.parse("chat", body)
    assert (refused.value.status, refused.value.param) == (400, "messages[0].content[0].text")
