"""Images through the playground's chat proxy: OpenAI's content parts with data URLs pass up to
the router's body limit (beyond Django's 2.5 MiB default for a form) and reach the router as
sent; a malformed part is a 400 naming messages; a body beyond the router's limit is a 413 that
says so; the router's refusal becomes a readable error event; the request page shows a
request's images and prompt tokens."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import AsyncClient, Client
from django.utils import timezone

from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.live.logstore import LogStore
from console.playground.proxy import ROUTER_MAX_BODY_BYTES, BodyTooLarge, encode_body, refusal_event
from console.supervisor.capture import CapturedLine
from console.supervisor.models import ManagedProcess

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
REFUSAL = {"error": {"message": "this model accepts no images", "type": "invalid_request_error",
                     "param": "messages[0].content[1]", "code": None}}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _ask(*parts: dict[str, Any], role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": [{"type": "text", "text": "what is it?"},
                                                    *parts]}]}


class _Router(BaseHTTPRequestHandler):
    received: list[bytes] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        _Router.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        if _Router.status != 200:
            payload = json.dumps(REFUSAL).encode()
            self.send_response(_Router.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        usage = {"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 1}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def router(deployment: Deployment) -> Iterator[list[bytes]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Deployment.objects.filter(pk=deployment.pk).update(router_port=server.server_address[1])
    _Router.received, _Router.status = [], 200
    yield _Router.received
    server.shutdown()
    server.server_close()


@pytest.fixture
def client(owner: User) -> Client:
    signed_in = Client()
    signed_in.force_login(owner)
    return signed_in


async def _ask_async(owner: User, deployment: Deployment, body: dict[str, Any]) -> tuple[int, str]:
    """(status, the streamed events) of a chat, as the existing streaming tests ask it."""
    client = AsyncClient()
    await client.aforce_login(owner)
    response = await client.post(f"/api/v1/deployments/{deployment.pk}/chat",
                                 data=json.dumps(body), content_type="application/json")
    if response.status_code != 200:
        return response.status_code, response.content.decode()
    return 200, b"".join([chunk async for chunk in response.streaming_content]).decode()


def _post(client: Client, deployment: Deployment, body: dict[str, Any] | str) -> Any:
    return client.post(f"/api/v1/deployments/{deployment.pk}/chat",
                       data=body if isinstance(body, str) else json.dumps(body),
                       content_type="application/json")


@pytest.mark.django_db(transaction=True)
async def test_an_image_of_three_and_a_half_mib_reaches_the_router_as_sent(
        owner: User, deployment: Deployment, router: list[bytes]) -> None:
    big = base64.b64encode(bytes(int(2.6 * (1 << 20)))).decode()  # 3.5 MiB of base64
    body = _ask(_image(f"data:image/png;base64,{big}"), _image(f"data:image/jpeg;base64,{PNG}"))
    status, events = await _ask_async(owner, deployment, body)
    assert status == 200, events[:300]
    assert '"prompt_tokens": 90' in events
    [sent] = router
    assert len(sent) > 3.4 * (1 << 20)
    assert json.loads(sent)["messages"] == body["messages"]


@pytest.mark.parametrize(("content", "said"), [
    ([_image("https://example.com/cat.png")], "must be a data URL"),
    ([_image("data:image/png;base64,not base64!")], "base64 is broken"),
    ([_image("data:text/plain;base64,aGk=")], "must be a data URL"),
    ([{"type": "image_url", "image_url": "data:image/png;base64,aGk="}], "an image part is"),
    ([{"type": "input_audio", "input_audio": {}}], "type must be text or image_url"),
    ([{"type": "text", "text": 5}], "a text part is"),
])
def test_a_malformed_part_is_a_400_naming_messages(client: Client, deployment: Deployment,
                                                   content: list[dict[str, Any]],
                                                   said: str) -> None:
    response = _post(client, deployment, _ask(*content))
    assert response.status_code == 400
    assert said in json.dumps(response.json()["messages"])


def test_only_a_users_message_may_carry_images(client: Client, deployment: Deployment) -> None:
    response = _post(client, deployment,
                     _ask(_image(f"data:image/png;base64,{PNG}"), role="assistant"))
    assert response.status_code == 400
    assert "only a user's message may carry images" in json.dumps(response.json())
    assert _post(client, deployment, {"messages": [
        {"role": "user", "content": []}]}).status_code == 400


def test_a_body_beyond_the_routers_limit_is_a_413_that_says_so(
        client: Client, deployment: Deployment, router: list[bytes]) -> None:
    huge = base64.b64encode(bytes(ROUTER_MAX_BODY_BYTES * 3 // 4 + 1024)).decode()
    response = _post(client, deployment, _ask(_image(f"data:image/png;base64,{huge}")))
    assert response.status_code == 413
    assert f"accepts at most {ROUTER_MAX_BODY_BYTES}" in response.json()["body"][0]
    assert router == []
    # Within the limit as sent, beyond it once the console adds its fields: refused as well.
    with pytest.raises(BodyTooLarge, match="would be"):
        encode_body({"messages": [], "pad": "x" * 100}, limit=100)


@pytest.mark.django_db(transaction=True)
async def test_the_routers_refusal_is_one_readable_error_event(
        owner: User, deployment: Deployment, router: list[bytes]) -> None:
    _Router.status = 400
    status, event = await _ask_async(owner, deployment,
                                     _ask(_image(f"data:image/png;base64,{PNG}")))
    assert status == 200  # the stream had begun: the error is its one event
    error = json.loads(event.removeprefix("data: "))["error"]
    assert error == {"message": "the router refused the request (400): this model accepts no "
                                "images (field messages[0].content[1])",
                     "status": 400, "param": "messages[0].content[1]"}
    # Not OpenAI's error object: its text, as it came.
    plain = json.loads(refusal_event(502, b"bad gateway").decode().removeprefix("data: "))
    assert plain["error"]["message"] == "the router answered 502: bad gateway"


def test_the_playground_offers_images_only_when_every_variant_takes_them(
        client: Client, deployment: Deployment) -> None:
    url = f"/deployments/{deployment.name}/playground/"
    assert 'id="attach"' not in client.get(url).content.decode()
    Variant.objects.filter(workers__deployment=deployment).update(modalities=["text", "image"])
    page = client.get(url).content.decode()
    assert 'id="attach"' in page and f'data-max-body="{ROUTER_MAX_BODY_BYTES}"' in page


def test_the_request_page_shows_the_images_and_the_prompt_tokens(
        client: Client, deployment: Deployment) -> None:
    router = ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                           port=1, log_path="/nonexistent.log")
    timeline = {"request_id": "req-img", "endpoint": "chat", "status": 200, "error": None,
                "events_ms": {"received": 0.0, "first_token": 40.0}, "prefill": None,
                "decode": None, "prompt_tokens": 1234, "completion_tokens": 4,
                "stream_chunks": 4, "images": 2, "kv": {}}
    text_only = {**timeline, "request_id": "req-text", "prompt_tokens": 9}
    del text_only["images"]  # a router from before the field: none
    LogStore().write([CapturedLine(router.pk, "2026 INFO pdserve.router.timeline timeline "
                                   + json.dumps(t), timezone.now())
                      for t in (timeline, text_only)])
    page = client.get(f"/deployments/{deployment.name}/requests/?id=req-img").content.decode()
    assert '<span id="timeline-prompt-tokens">1234</span> tokens (image tokens included)' in page
    assert '<span id="timeline-images">2</span> images' in page
    page = client.get(f"/deployments/{deployment.name}/requests/?id=req-text").content.decode()
    assert '<span id="timeline-prompt-tokens">9</span> tokens ·' in page
    assert '<span id="timeline-images">0</span> images' in page
