"""Image parts through the real router app (media.py): each bad input is answered 400 naming its
field before any worker is called; good images reach every worker (/tokenize, prefill, decode)
as the same data URL: a client's data URL as sent, a file or remote image inlined."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from inference.router.config import RouterConfig, build_parser, config_from_args
from inference.router.prompts import PromptChecker
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MINIMAL_ARGV = ["--served-model-name", "m", "--tokenizer", "/m", "--max-model-len", "128",
                "--prefill", "http://p:1", "--decode", "http://d:2"]


def image_bytes(size: tuple[int, int] = (8, 8), image_format: str = "PNG", noise: bool = False) -> bytes:
    image = Image.new("RGB", size, "red")
    if noise:  # incompressible, so that the file is large
        image = Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3))
    buffer = io.BytesIO()
    image.save(buffer, image_format)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello world"}, *parts]}]}


@dataclass
class ImageStub(StubVLLM):
    """A worker that renders image parts as nothing, as a tokenizer without an image processor
    would; it records each body as the stubs do."""

    def _prompt_ids(self, endpoint: str, body: dict[str, Any]) -> list[int]:
        if endpoint == "chat":
            body = {**body, "messages": [
                {**m, "content": [p for p in m["content"] if p.get("type") == "text"]}
                if isinstance(m.get("content"), list) else m for m in body["messages"]]}
        return super()._prompt_ids(endpoint, body)


@dataclass
class Setup:
    prefill: ImageStub
    decode: ImageStub
    images: str  # a remote host's base URL, serving /ok.png, /missing, /moved, /endless
    allowed: Path  # a media directory
    outside: Path  # a directory that is not one

    def received(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Each call the workers received: worker, path and body."""
        return [(stub.name, r.path, r.body) for stub in (self.prefill, self.decode)
                for r in stub.requests]


@pytest_asyncio.fixture(loop_scope="function")
async def setup(make_checker: Callable[..., PromptChecker], tmp_path: Path) -> AsyncIterator[Setup]:
    async def ok(_request: web.Request) -> web.Response:
        return web.Response(body=image_bytes(), content_type="image/png")

    async def moved(_request: web.Request) -> web.Response:
        raise web.HTTPFound("/ok.png")

    async def endless(request: web.Request) -> web.StreamResponse:
        # Chunked, with no Content-Length: only counting while reading can stop it.
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"\0" * 1024)
        return response

    app = web.Application()
    app.router.add_get("/ok.png", ok)
    app.router.add_get("/moved", moved)
    app.router.add_get("/endless", endless)
    images = TestServer(app, host="127.0.0.1")
    await images.start_server()
    tokenizer = make_checker().tokenizer
    prefill, decode = ImageStub("prefill", tokenizer), ImageStub("decode", tokenizer)
    await prefill.start()
    await decode.start()
    (tmp_path / "allowed").mkdir()
    (tmp_path / "outside").mkdir()
    yield Setup(prefill, decode, str(images.make_url("")).rstrip("/"), tmp_path / "allowed",
                tmp_path / "outside")
    for server in (prefill, decode):
        await server.close()
    await images.close()


async def router(start_router: StartRouter, setup: Setup, **overrides: Any) -> RunningRouter:
    return await start_router(prefill=(setup.prefill.url,), decode=(setup.decode.url,),
                              **{"max_images": 4, **overrides})


# Each case: the router's settings, the parts after the text, the field named, a piece of the
# message, and the reason counted.
Case = Callable[[Setup], tuple[dict[str, Any], list[dict[str, Any]], str, str, str]]
URL = "messages[0].content[1].image_url.url"
PART = "messages[0].content[1]"


def _symlink_out(s: Setup) -> str:
    (s.outside / "secret.png").write_bytes(image_bytes())
    (s.allowed / "link.png").symlink_to(s.outside / "secret.png")
    return f"file://{s.allowed / 'link.png'}"


BAD: dict[str, Case] = {
    "too many images": lambda s: ({"max_images": 2}, [image_part(data_url(image_bytes()))] * 3,
                                  "messages", "3 images in the request; this deployment accepts "
                                  "at most 2", "too_many"),
    "image too big": lambda s: ({"max_image_bytes": 1024},
                                [image_part(data_url(image_bytes((32, 32), noise=True)))], URL,
                                "the image exceeds 1024 bytes", "too_large"),
    "too many pixels": lambda s: ({"max_image_pixels": 100},
                                  [image_part(data_url(image_bytes((16, 16))))], URL,
                                  "16x16 pixels; this deployment accepts at most 100",
                                  "too_many_pixels"),
    "not base64": lambda s: ({}, [image_part("data:image/png;base64,@@not-base64@@")], URL,
                             "not valid base64", "bad_data_url"),
    "not an image data URL": lambda s: ({}, [image_part(data_url(b"plain text", "text/plain"))],
                                        URL, "data:image/<type>;base64,<data>", "bad_data_url"),
    "not an image": lambda s: ({}, [image_part(data_url(b"hello, not an image at all"))], URL,
                               "unreadable image: ", "unreadable"),
    "truncated PNG": lambda s: ({}, [image_part(data_url(image_bytes()[:-30]))], URL,
                                "unreadable image: ", "unreadable"),
    "file outside the media paths": lambda s: (
        {"media_paths": (str(s.allowed),)}, [image_part(f"file://{s.outside / 'x.png'}")], URL,
        "outside this deployment's media paths", "file_refused"),
    "file through a symlink out": lambda s: (
        {"media_paths": (str(s.allowed),)}, [image_part(_symlink_out(s))], URL,
        "outside this deployment's media paths", "file_refused"),
    "missing file": lambda s: ({"media_paths": (str(s.allowed),)},
                               [image_part(f"file://{s.allowed / 'absent.png'}")], URL,
                               "no such file", "file_refused"),
    "file URL with no media path": lambda s: ({}, [image_part(f"file://{s.allowed / 'x.png'}")],
                                              URL, "it has no media paths", "file_refused"),
    "remote URL with no media domain": lambda s: (
        {}, [image_part(f"{s.images}/ok.png")], URL,
        "remote image URLs are not allowed by this deployment's plan", "remote_refused"),
    "a domain not allowed": lambda s: (
        {"media_domains": ("images.example",)}, [image_part(f"{s.images}/ok.png")], URL,
        "'127.0.0.1' is not among this deployment's media domains", "remote_refused"),
    "remote 404": lambda s: ({"media_domains": ("127.0.0.1",)},
                             [image_part(f"{s.images}/missing")], URL, "answered HTTP 404",
                             "fetch_failed"),
    "remote redirect": lambda s: ({"media_domains": ("127.0.0.1",)},
                                  [image_part(f"{s.images}/moved")], URL, "answered HTTP 302",
                                  "fetch_failed"),
    "remote too big": lambda s: ({"media_domains": ("127.0.0.1",), "max_image_bytes": 4096},
                                 [image_part(f"{s.images}/endless")], URL,
                                 "the image exceeds 4096 bytes", "too_large"),
    "an ftp URL": lambda s: ({}, [image_part("ftp://host/x.png")], URL, "data:, file:// or",
                             "bad_url"),
    "image_url not an object": lambda s: (
        {}, [{"type": "image_url", "image_url": data_url(image_bytes())}],
        f"{PART}.image_url", "'image_url' as an object with a string 'url'", "bad_part"),
    "image_url without a url": lambda s: ({}, [{"type": "image_url", "image_url": {"uri": "x"}}],
                                          f"{PART}.image_url", "a string 'url'", "bad_part"),
    "input_audio": lambda s: ({}, [{"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "wav"}}], PART, "serves text and images only",
                              "unsupported_part"),
    "audio_url": lambda s: ({}, [{"type": "audio_url", "audio_url": {"url": "http://a/b.wav"}}],
                            PART, "'audio_url' parts are not served", "unsupported_part"),
    "video_url": lambda s: ({}, [{"type": "video_url", "video_url": {"url": "http://a/b.mp4"}}],
                            PART, "'video_url' parts are not served", "unsupported_part"),
    "image_embeds": lambda s: ({}, [{"type": "image_embeds", "image_embeds": "AAAA"}], PART,
                               "serves text and images only", "unsupported_part"),
    "untyped audio": lambda s: ({}, [{"audio_url": "http://a/b.wav"}], PART,
                                "'audio_url' parts are not served", "unsupported_part"),
    "an image to a text-only model": lambda s: (
        {"max_images": 0}, [image_part(data_url(image_bytes()))], PART,
        "this model accepts no images", "no_images"),
}


@pytest.mark.parametrize("name", list(BAD))
async def test_bad_image_input_is_refused_naming_its_field_and_reaches_no_worker(
        start_router: StartRouter, setup: Setup, name: str) -> None:
    settings, parts, param, fragment, reason = BAD[name](setup)
    running = await router(start_router, setup, **settings)
    response = await running.client.post("/v1/chat/completions", json=chat(*parts))
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["type"] == "BadRequestError" and error["code"] is None
    assert error["param"] == param
    assert fragment in error["message"]
    assert setup.received() == []
    assert await running.metric("pdserve_router_image_refusals_total", {"reason": reason}) == 1
    assert await running.metric("pdserve_router_images_total", {}) == 0


def timelines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(record.getMessage().removeprefix("timeline "))
            for record in caplog.records if record.name == "pdserve.router.timeline"]


def urls_received(setup: Setup) -> list[tuple[str, str, list[str]]]:
    """Each worker call's worker, path and the image URLs of its messages."""
    return [(name, path, [p["image_url"]["url"] for m in body["messages"] for p in m["content"]
                          if p.get("type") == "image_url"])
            for name, path, body in setup.received()]


def every_worker(urls: list[str]) -> list[tuple[str, str, list[str]]]:
    """What a PD request's worker calls carry: decode renders its prompt, prefill computes it,
    decode continues it."""
    return [("prefill", "/v1/chat/completions", urls), ("decode", "/tokenize", urls),
            ("decode", "/v1/chat/completions", urls)]


async def test_a_data_url_reaches_every_worker_as_sent(
        start_router: StartRouter, setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    running = await router(start_router, setup)
    sent = chat(image_part(data_url(image_bytes())), image_part(data_url(image_bytes((4, 4)))))
    response = await running.client.post("/v1/chat/completions", json=sent)
    assert response.status == 200, await response.text()
    expected = [data_url(image_bytes()), data_url(image_bytes((4, 4)))]
    assert urls_received(setup) == every_worker(expected)
    assert setup.decode.requests[0].body["messages"] == sent["messages"]
    [line] = timelines(caplog)
    assert line["images"] == 2
    assert await running.metric("pdserve_router_images_total", {}) == 2


async def test_a_data_url_is_relayed_byte_exact(start_router: StartRouter, setup: Setup) -> None:
    """A request sent whole (n=2) goes on as the client's own bytes: nothing re-encoded."""
    seen: list[bytes] = []
    running = await router(start_router, setup)
    forwarder = running.router.registry.primary.forwarder
    forward = forwarder.forward

    async def spy(request: Any, role: str, parsed: Any, raw: bytes, *args: Any, **kw: Any) -> Any:
        seen.append(raw)
        return await forward(request, role, parsed, raw, *args, **kw)

    forwarder.forward = spy  # type: ignore[method-assign]
    raw = json.dumps({**chat(image_part(data_url(image_bytes()))), "n": 2}, indent=1).encode()
    response = await running.client.post("/v1/chat/completions", data=raw,
                                         headers={"Content-Type": "application/json"})
    assert response.status == 200, await response.text()
    assert seen == [raw]


@pytest.mark.parametrize("where", ["file", "remote"])
async def test_file_and_remote_images_reach_every_worker_as_the_same_data_url(
        start_router: StartRouter, setup: Setup, caplog: pytest.LogCaptureFixture,
        where: str) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    if where == "file":
        (setup.allowed / "cat.png").write_bytes(image_bytes())
        url, settings = f"file://{setup.allowed / 'cat.png'}", {"media_paths": (str(setup.allowed),)}
    else:
        url, settings = f"{setup.images}/ok.png", {"media_domains": ("127.0.0.1",)}
    running = await router(start_router, setup, **settings)
    response = await running.client.post("/v1/chat/completions", json=chat(image_part(url)))
    assert response.status == 200, await response.text()
    inlined = [data_url(image_bytes())]
    assert urls_received(setup) == every_worker(inlined)
    [line] = timelines(caplog)
    assert line["images"] == 1


async def test_an_inlined_image_takes_its_type_from_its_bytes(
        start_router: StartRouter, setup: Setup) -> None:
    jpeg = image_bytes(image_format="JPEG")
    (setup.allowed / "named.png").write_bytes(jpeg)
    running = await router(start_router, setup, media_paths=(str(setup.allowed),))
    response = await running.client.post(
        "/v1/chat/completions", json=chat(image_part(f"file://{setup.allowed / 'named.png'}")))
    assert response.status == 200, await response.text()
    assert {url for _, _, urls in urls_received(setup) for url in urls} == {
        data_url(jpeg, "image/jpeg")}


async def test_a_text_request_is_not_looked_at(
        start_router: StartRouter, setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.timeline")
    running = await router(start_router, setup)

    async def never(_body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        raise AssertionError("a text request went through the image check")

    running.router.media.inline = never  # type: ignore[method-assign]
    sent = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
    response = await running.client.post("/v1/chat/completions", json=sent)
    assert response.status == 200, await response.text()
    assert setup.prefill.requests[0].body["messages"] == sent["messages"]
    [line] = timelines(caplog)
    assert line["images"] == 0


async def test_text_parts_and_tools_pass_the_check_unchanged(
        start_router: StartRouter, setup: Setup) -> None:
    running = await router(start_router, setup, max_images=0)
    sent = {**chat(), "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}
    response = await running.client.post("/v1/chat/completions", json=sent)
    assert response.status == 200, await response.text()
    assert len(setup.received()) == 3
    assert all(body["messages"] == sent["messages"] for _, _, body in setup.received())


def test_the_media_flags_repeat_and_default_to_refusing(tmp_path: Path) -> None:
    config = config_from_args(build_parser().parse_args(MINIMAL_ARGV))
    assert (config.max_images, config.max_image_bytes, config.max_image_pixels,
            config.media_paths, config.media_domains, config.media_fetch_timeout_s) == (
        0, 2 * 1024 * 1024, 4096 * 4096, (), (), 10.0)
    args = build_parser().parse_args([
        *MINIMAL_ARGV, "--max-images", "3", "--media-path", str(tmp_path), "--media-path", "/",
        "--media-domain", "a.example", "--media-domain", "b.example", "--media-fetch-timeout", "2.5"])
    config = config_from_args(args)
    assert config.max_images == 3 and config.media_fetch_timeout_s == 2.5
    assert config.media_paths == (str(tmp_path), "/")
    assert config.media_domains == ("a.example", "b.example")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"max_images": -1}, "--max-images: must be at least 0"),
    ({"max_image_bytes": 0}, "--max-image-bytes: must be positive"),
    ({"max_image_pixels": 0}, "--max-image-pixels: must be positive"),
    ({"media_paths": ("/no/such/dir",)}, "--media-path: /no/such/dir is not a directory"),
    ({"media_domains": ("https://a.example",)}, "--media-domain: 'https://a.example' is not a bare"),
    ({"media_domains": ("a.example:8080",)}, "--media-domain: 'a.example:8080' is not a bare"),
    ({"media_fetch_timeout_s": 0.0}, "--media-fetch-timeout: must be positive"),
])
def test_bad_media_settings_are_refused_naming_the_flag(overrides: dict[str, Any],
                                                         message: str) -> None:
    valid = {"served_model_name": "m", "tokenizer_path": "/m", "max_model_len": 128,
             "prefill_urls": ("http://p:1",), "decode_urls": ("http://d:2",)}
    with pytest.raises(ValueError) as refused:
        RouterConfig(**{**valid, **overrides}).validate()
    assert str(refused.value).startswith(message)


async def test_an_image_beside_a_malformed_message_is_checked_too(
        start_router: StartRouter, setup: Setup) -> None:
    """A request the router does not parse goes whole to a worker: its images are checked all
    the same."""
    running = await router(start_router, setup, max_images=0)
    sent = {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": [image_part(data_url(image_bytes()))]}, {"content": "no role"}]}
    response = await running.client.post("/v1/chat/completions", json=sent)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "messages[0].content[0]"
    assert setup.received() == []


async def test_tokenize_holds_images_to_the_same_limits(start_router: StartRouter,
                                                        setup: Setup) -> None:
    """vLLM's /tokenize renders chat messages with their images: relayed, it must not be a way
    around the limits, and what it relays is inlined as a chat request's is."""
    (setup.allowed / "cat.png").write_bytes(image_bytes())
    running = await router(start_router, setup, max_images=1, media_paths=(str(setup.allowed),))
    body = chat(image_part(f"file://{setup.allowed / 'cat.png'}"))
    refused = await running.client.post("/tokenize", json=chat(*[image_part(data_url(
        image_bytes()))] * 2))
    assert refused.status == 400
    assert (await refused.json())["error"]["param"] == "messages"
    assert setup.received() == []
    response = await running.client.post("/tokenize", json=body)
    assert response.status == 200, await response.text()
    assert urls_received(setup) == [("decode", "/tokenize", [data_url(image_bytes())])]
    text = await running.client.post("/tokenize", json={"model": MODEL, "prompt": "hello"})
    assert text.status == 200
