"""The playground's images in a browser: against a stand-in router (aiohttp, on a real socket)
that records the body the console forwards and streams an OpenAI chat answer, an image picked
with the file picker and one pasted into the prompt go as two image_url data-URL parts of the
user's message, each the image's bytes; an attached image can be removed before sending; the
router's refusal is shown in the chat, naming its field; a text-only deployment has no attach
control."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from django.contrib.auth.models import User
from PIL import Image
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from console.catalog.models import Variant
from console.deployments.models import Deployment
from tests.chromium import signed_in
from tests.console.sockets import free_port
from tests.console.tiny_models import make_plan

PASSWORD = "browser-pass-123"
ANSWER = ["A red", " square", " on grey."]
REFUSAL = {"error": {"message": "this model accepts no images", "type": "invalid_request_error",
                     "param": "messages[0].content[1]", "code": None}}
DATA_URL = "data:image/png;base64,"
# The paste a user makes: a ClipboardEvent whose clipboard holds one PNG file and no text.
PASTE = """([b64, name]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type: "image/png" }));
  const prompt = document.querySelector("textarea[name=prompt]");
  prompt.focus();
  prompt.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true,
                                                     cancelable: true }));
}"""


def png(colour: tuple[int, int, int], side: int = 24) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(out, format="PNG")
    return out.getvalue()


class StubRouter:
    """The deployment's router: records each chat body; streams ANSWER with usage, or answers
    400 with REFUSAL while ``refuse`` is set."""

    def __init__(self) -> None:
        self.port = free_port()
        self.bodies: list[dict[str, Any]] = []
        self.refuse = False
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        if self.refuse:
            return web.json_response(REFUSAL, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in ANSWER:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 321, "completion_tokens": 3}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def _start(self) -> None:
        # The real router's body limit: the console's request must pass it.
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def router() -> Iterator[StubRouter]:
    stub = StubRouter()
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def plan(transactional_db: None, tmp_path: Path, settings: Any, router: StubRouter) -> Deployment:
    settings.DATA_DIR = tmp_path / "data"
    User.objects.create_superuser(username="operator", email="", password=PASSWORD)
    deployment = make_plan(tmp_path, router_port=router.port, max_images_per_prompt=4)
    Variant.objects.filter(workers__deployment=deployment).update(modalities=["text", "image"])
    return deployment


@pytest.fixture
def page(browser: Browser, live_server: LiveServer, plan: Deployment) -> Iterator[Page]:
    with signed_in(browser, live_server.url, "operator", PASSWORD) as page:
        page.goto(f"/deployments/{plan.name}/playground/")
        yield page


def _image_parts(body: dict[str, Any]) -> list[bytes]:
    content = body["messages"][-1]["content"]
    assert isinstance(content, list) and content[0]["type"] == "text"
    urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
    assert all(url.startswith(DATA_URL) for url in urls), [url[:40] for url in urls]
    return [base64.b64decode(url.removeprefix(DATA_URL)) for url in urls]


def test_a_picked_and_a_pasted_image_go_as_data_url_parts(page: Page, router: StubRouter) -> None:
    picked, pasted, dropped = png((200, 30, 30)), png((30, 30, 200)), png((30, 200, 30))
    page.set_input_files("#attach", files=[
        {"name": "red.png", "mimeType": "image/png", "buffer": picked},
        {"name": "green.png", "mimeType": "image/png", "buffer": dropped}])
    page.evaluate(PASTE, [base64.b64encode(pasted).decode(), "blue.png"])
    attached = page.locator("#attachments .attachment")
    expect(attached).to_have_count(3)
    expect(attached.locator("img.thumb")).to_have_count(3)
    # Removed before sending: it does not go.
    attached.filter(has=page.locator("img[alt='green.png']")).locator(".remove-image").click()
    expect(attached).to_have_count(2)

    page.fill("textarea[name=prompt]", "What do you see?")
    page.click("#send")
    answer = page.locator(".bubble.assistant")
    expect(answer).to_have_text("".join(ANSWER))
    stats = page.locator(".stats")
    expect(stats).to_contain_text("prompt 321 tokens (2 images)")
    expect(page.locator("#attachments .attachment")).to_have_count(0)
    expect(page.locator(".bubble.user img.thumb")).to_have_count(2)

    [body] = router.bodies
    assert body["messages"][-1]["content"][0] == {"type": "text", "text": "What do you see?"}
    assert sorted(_image_parts(body)) == sorted([picked, pasted])
    assert body["model"] == "tiny" and body["stream"] is True

    # The next turn sends the conversation so far: the first turn's images with it.
    page.fill("textarea[name=prompt]", "And now?")
    page.click("#send")
    expect(page.locator(".bubble.assistant")).to_have_count(2)
    expect(page.locator(".stats").nth(1)).to_contain_text("prompt 321 tokens")
    assert len(router.bodies) == 2
    assert [m["role"] for m in router.bodies[1]["messages"]] == ["user", "assistant", "user"]
    assert router.bodies[1]["messages"][-1]["content"] == "And now?"

    # The plan lets 4 images through the router a request, the history's 2 included.
    page.set_input_files("#attach", files=[
        {"name": f"{n}.png", "mimeType": "image/png", "buffer": png((n, n, n))}
        for n in range(3)])
    expect(page.locator("#attachments .attachment")).to_have_count(2)
    expect(page.locator("#attach-note")).to_contain_text("at most 4 image(s) a request")


def test_the_routers_refusal_is_shown_naming_its_field(page: Page, router: StubRouter) -> None:
    router.refuse = True
    page.set_input_files("#attach", files=[
        {"name": "red.png", "mimeType": "image/png", "buffer": png((200, 30, 30))}])
    expect(page.locator("#attachments .attachment")).to_have_count(1)
    page.fill("textarea[name=prompt]", "What do you see?")
    page.click("#send")
    refused = page.locator(".bubble.assistant.error")
    expect(refused).to_contain_text("the router refused the request (400): this model accepts "
                                    "no images (field messages[0].content[1])")
    assert len(router.bodies) == 1
    # The refused turn left the history: the next one goes without its image.
    router.refuse = False
    page.fill("textarea[name=prompt]", "Hello?")
    page.click("#send")
    expect(page.locator(".bubble.assistant").nth(1)).to_have_text("".join(ANSWER))
    assert router.bodies[1]["messages"] == [{"role": "user", "content": "Hello?"}]


def test_a_text_only_deployment_has_no_attach_control(browser: Browser, live_server: LiveServer,
                                                      plan: Deployment,
                                                      router: StubRouter) -> None:
    Variant.objects.filter(workers__deployment=plan).update(modalities=["text"])
    with signed_in(browser, live_server.url, "operator", PASSWORD) as page:
        page.goto(f"/deployments/{plan.name}/playground/")
        expect(page.locator("#chat-form")).to_be_visible()
        expect(page.locator("#attach")).to_have_count(0)
        expect(page.locator("#attachments")).to_have_count(0)
        # A pasted image attaches nothing: the message goes as text.
        page.evaluate(PASTE, [base64.b64encode(png((1, 2, 3))).decode(), "x.png"])
        page.fill("textarea[name=prompt]", "Hi")
        page.click("#send")
        expect(page.locator(".bubble.assistant")).to_have_text("".join(ANSWER))
    assert router.bodies[0]["messages"] == [{"role": "user", "content": "Hi"}]
