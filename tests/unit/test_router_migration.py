"""Request migration (issue 25): no request is lost to a worker that fails. Before the first
byte reached the client the request runs again on another worker; a stream cut mid-way goes on
on another worker from its last token, with no seam; what cannot go on ends with an SSE error
event naming why. Stub workers stream like a greedy model (``StubVLLM.generative``), so the
text a migrated stream delivers can be compared with an uninterrupted one."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from PIL import Image

from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MIGRATIONS = "pdserve_router_migrations_total"
REFUSED = "pdserve_router_migrations_refused_total"


def body_for(path: str, **extra: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": MODEL, "messages": [{"role": "user", "content": "tell me a story"}],
                "max_tokens": 8, "stream": True, **extra}
    return {"model": MODEL, "prompt": "hello world the quick brown fox", "max_tokens": 8,
            "stream": True, **extra}


def events(raw: bytes) -> list[str]:
    return [part.removeprefix("data: ") for part in raw.decode().split("\n\n") if part]


def text_of(raw: bytes) -> str:
    out = []
    for event in events(raw):
        if event == "[DONE]":
            continue
        for choice in json.loads(event).get("choices") or []:
            out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


async def generative(make_stub: MakeStub, *names: str) -> list[StubVLLM]:
    stubs = [await make_stub(name) for name in names]
    for stub in stubs:
        stub.generative = True
    return stubs


async def uninterrupted(start_router: StartRouter, make_stub: MakeStub, path: str,
                        body: dict[str, Any]) -> bytes:
    [worker] = await generative(make_stub, "whole")
    running = await start_router(colocated=(worker.url,))
    response = await running.client.post(path, json=body)
    assert response.status == 200
    return await response.read()


def timelines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(record.getMessage().removeprefix("timeline "))
            for record in caplog.records if record.name == "pdserve.router.timeline"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("to", ["decode", "prefill"])
async def test_a_decode_dying_mid_stream_is_continued_with_no_seam(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture,
        path: str, to: str) -> None:
    """Cut after 3 events; continued on a second decode, or on prefill (degraded mode) when
    there is none: the client's text equals an uninterrupted answer, one id throughout, one
    [DONE], and usage counting the whole answer."""
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    body = body_for(path, stream_options={"include_usage": True})
    expected = await uninterrupted(start_router, make_stub, path, body)

    prefill, first, second = await generative(make_stub, "prefill", "decode-a", "decode-b")
    decodes = (first.url, second.url) if to == "decode" else (first.url,)
    running = await start_router(prefill=(prefill.url,), decode=decodes,
                                 kv_channel="shared-storage", decode_policy="round_robin")
    # Whichever decode is picked first dies after its third event.
    first.die_after_chunks = second.die_after_chunks = 3
    response = await running.client.post(path, json=body, headers={"X-Request-Id": "mig-1"})
    assert response.status == 200
    raw = await response.read()

    assert text_of(raw) == text_of(expected) and text_of(raw)
    parsed = [json.loads(e) for e in events(raw) if e != "[DONE]"]
    assert events(raw)[-1] == "[DONE]" and events(raw).count("[DONE]") == 1
    assert len({e["id"] for e in parsed}) == 1 and len({e["created"] for e in parsed}) == 1
    assert all("token_ids" not in c and "prompt_token_ids" not in e
               for e in parsed for c in e.get("choices") or [])
    if path == CHAT:
        assert all(e["object"] == "chat.completion.chunk" for e in parsed)
        assert sum("role" in c["delta"] for e in parsed for c in e["choices"]) == 1
    usage = parsed[-1]["usage"]
    assert usage["completion_tokens"] == 8
    assert usage == json.loads(events(expected)[-2])["usage"]

    # The continuation: the prompt and the 2-3 tokens sent, as token ids, max_tokens reduced.
    failed = first if first.requests and first.requests[-1].body.get("stream") else second
    continued_on = second if to == "decode" and failed is first else (
        first if to == "decode" else prefill)
    continuation = continued_on.requests[-1]
    assert continuation.path == COMPLETIONS
    sent_tokens = 3 if path == COMPLETIONS else 2  # a chat stream opens with the role event
    prompt = continuation.body["prompt"]
    assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
    assert continuation.body["max_tokens"] == 8 - sent_tokens
    first_prompt = failed._prompt_ids("chat" if path == CHAT else "completions",
                                      failed.requests[-1].body)
    assert prompt[:len(first_prompt)] == first_prompt
    assert len(prompt) == len(first_prompt) + sent_tokens

    assert await running.metric(MIGRATIONS, {"reason": "mid_stream", "role": "decode"}) == 1
    [line] = [t for t in timelines(caplog) if t["request_id"] == "mig-1"]
    assert line["status"] == 200 and line["error"] is None
    [migration] = line["migrations"]
    assert migration["reason"] == "mid_stream" and migration["sent_tokens"] == sent_tokens
    assert migration["from"] == failed.url and migration["to"] == continued_on.url
    assert "migrated" in line["events_ms"]
    assert line["completion_tokens"] == 8


async def test_a_decode_dying_before_the_first_byte_is_retried_elsewhere(
        start_router: StartRouter, make_stub: MakeStub, caplog: pytest.LogCaptureFixture) -> None:
    """Dispatched to a decode that dies before any byte: the request runs whole on the other
    decode, 0 failed, counted as before_first_byte."""
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    prefill, first, second = await generative(make_stub, "prefill", "decode-a", "decode-b")
    first.die_after_chunks = second.die_after_chunks = 0
    running = await start_router(prefill=(prefill.url,), decode=(first.url, second.url),
                                 kv_channel="nixl", decode_policy="round_robin")
    body = body_for(COMPLETIONS)
    expected = await uninterrupted(start_router, make_stub, COMPLETIONS, body)
    response = await running.client.post(COMPLETIONS, json=body)
    assert response.status == 200
    # The first dies before a byte; the second would too, so let it live for the retry.
    raw = await response.read()
    assert text_of(raw) == text_of(expected)
    assert await running.metric(MIGRATIONS, {"reason": "before_first_byte", "role": "decode"}) == 1
    retried = [r for s in (first, second) for r in s.requests]
    assert len(retried) == 2
    # The KV hand-off is not reused: the second decode computes the prompt itself.
    assert "kv_transfer_params" in retried[0].body
    assert "kv_transfer_params" not in retried[1].body


@pytest.fixture(autouse=True)
def _second_stub_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    """In these tests a stub told to die does so once: the next request it gets is answered,
    like a second worker that is alive."""
    original = StubVLLM._stream

    async def once(self: StubVLLM, request: Any, endpoint: str, body: dict[str, Any]) -> Any:
        try:
            return await original(self, request, endpoint, body)
        finally:
            if self.die_after_chunks is not None:
                # Every stub of a test shares the trigger: only the first stream dies.
                for stub in _alive:
                    stub.die_after_chunks = None

    _alive.clear()
    monkeypatch.setattr(StubVLLM, "_stream", once)
    original_start = StubVLLM.start

    async def start(self: StubVLLM) -> None:
        _alive.append(self)
        await original_start(self)

    monkeypatch.setattr(StubVLLM, "start", start)


_alive: list[StubVLLM] = []


@pytest.mark.parametrize(("extra", "reason"), [
    ({"n": 2}, "several_sequences"),
    ({"logprobs": 2}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"stop": ["w9"]}, "stop_strings"),
    ({"response_format": {"type": "json_object"}}, "structured_output"),
])
async def test_a_stream_that_cannot_go_on_ends_with_a_clear_error_event(
        start_router: StartRouter, make_stub: MakeStub, extra: dict[str, Any],
        reason: str) -> None:
    prefill, decode = await generative(make_stub, "prefill", "decode")
    decode.die_after_chunks = 3
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage")
    response = await running.client.post(COMPLETIONS, json=body_for(COMPLETIONS, **extra))
    assert response.status == 200
    raw = await response.read()
    last = events(raw)[-1]
    assert "[DONE]" not in events(raw)
    error = json.loads(last)["error"]
    assert error["code"] == "decode_failed"
    assert "cannot go on on another worker" in error["message"]
    # Nothing of a continuation: no token ids asked, prefill never saw a continuation.
    assert "return_token_ids" not in decode.requests[-1].body
    assert all(r.body.get("max_tokens") == 1 for r in prefill.requests)
    assert await running.metric(REFUSED, {"reason": reason}) == 1


async def test_a_worker_without_token_ids_cannot_be_continued(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    """The plain stub ignores return_token_ids in streams (like vLLM with a reasoning parser
    that hides them): the stream ends with the error event, naming why."""
    prefill, decode = await make_stub("prefill"), await make_stub("decode")
    decode.die_after_chunks = 2
    # The plain stub returns ids; this one is told not to.
    decode.sse_chunks = lambda endpoint, body=None, prompt_ids=None: StubVLLM.sse_chunks(  # type: ignore[method-assign]
        decode, endpoint)
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage")
    response = await running.client.post(COMPLETIONS, json=body_for(COMPLETIONS))
    raw = await response.read()
    error = json.loads(events(raw)[-1])["error"]
    assert "did not return the answer's token ids" in error["message"]
    assert await running.metric(REFUSED, {"reason": "no_token_ids"}) == 1


async def test_a_stream_whose_worker_dies_after_its_last_token_is_ended_by_the_router(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    """Every token reached the client, then its worker died before the usage event and
    [DONE]: the router sends them itself; no worker is asked again."""
    body = body_for(COMPLETIONS, stream_options={"include_usage": True})
    expected = await uninterrupted(start_router, make_stub, COMPLETIONS, body)
    prefill, decode = await generative(make_stub, "prefill", "decode")
    decode.die_after_chunks = 8  # after the 8th token's event (it carries finish_reason)
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage")
    response = await running.client.post(COMPLETIONS, json=body)
    raw = await response.read()
    assert text_of(raw) == text_of(expected)
    assert events(raw)[-1] == "[DONE]"
    assert json.loads(events(raw)[-2])["usage"]["completion_tokens"] == 8
    assert all(r.body.get("max_tokens") == 1 for r in prefill.requests)
    assert await running.metric(MIGRATIONS, {"reason": "after_last_token", "role": "decode"}) == 1


async def test_a_continuation_whose_connection_times_out_goes_on_on_the_same_worker(
        start_router: StartRouter, make_stub: MakeStub,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode dies mid-stream; its continuation's connection to the only prefill times out (a
    saturated host: the call never reached the worker). That prefill is still up and has no
    peer, so the continuation is made to it again: the client's text equals an uninterrupted
    answer (CI once saw 'no other ready worker' here)."""
    body = body_for(CHAT)
    expected = await uninterrupted(start_router, make_stub, CHAT, body)
    prefill, decode = await generative(make_stub, "prefill", "decode")
    decode.die_after_chunks = 3
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage")
    timed_out: list[str] = []
    connect = aiohttp.TCPConnector.connect

    async def slow_host(self: aiohttp.TCPConnector, req: aiohttp.ClientRequest,
                        *args: Any, **kwargs: Any) -> Any:
        # The first continuation (prefill's /v1/completions) finds the host too busy to connect.
        if (str(req.url).startswith(prefill.url) and req.url.path == COMPLETIONS
                and not timed_out):
            timed_out.append(str(req.url))
            raise aiohttp.ConnectionTimeoutError(f"connection timeout to {req.url}")
        return await connect(self, req, *args, **kwargs)

    monkeypatch.setattr(aiohttp.TCPConnector, "connect", slow_host)
    response = await running.client.post(CHAT, json=body)
    assert response.status == 200
    raw = await response.read()
    assert timed_out, "the continuation's connection was never attempted"
    assert events(raw)[-1] == "[DONE]", events(raw)[-2:]
    assert text_of(raw) == text_of(expected) and text_of(raw)
    continuations = [r for r in prefill.requests if r.path == COMPLETIONS]
    assert len(continuations) == 1  # the timed-out attempt never reached it
    assert await running.metric(REFUSED, {"reason": "no_worker"}) == 0


async def test_a_stream_with_an_image_ends_with_the_error_event_not_a_text_continuation(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    """A continuation is a token-id prompt: the image's placeholder ids without its pixels.
    So an image request cut mid-way is not continued, as a tools request is not."""
    picture = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(picture, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode()
    prefill, decode = await generative(make_stub, "prefill", "decode")
    decode.die_after_chunks = 3
    running = await start_router(prefill=(prefill.url,), decode=(decode.url,),
                                 kv_channel="shared-storage", max_images=1)
    response = await running.client.post(CHAT, json=body_for(CHAT, messages=[{
        "role": "user", "content": [{"type": "text", "text": "what is it"},
                                    {"type": "image_url", "image_url": {"url": url}}]}]))
    assert response.status == 200
    raw = await response.read()
    error = json.loads(events(raw)[-1])["error"]
    assert error["code"] == "decode_failed"
    assert "cannot go on on another worker" in error["message"]
    assert "return_token_ids" not in decode.requests[-1].body
    assert await running.metric(REFUSED, {"reason": "images"}) == 1
