"""The playground's chat proxy and the request timeline page."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import AsyncClient, Client
from django.utils import timezone

from console.deployments.models import Deployment
from console.live.logstore import LogStore
from console.live.timeline import find_request
from console.supervisor.capture import CapturedLine
from console.supervisor.models import ManagedProcess

SSE = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "Paris"}}]},
    {"choices": [{"index": 0, "delta": {"content": "."}}]},
    {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
]


class StubRouter(BaseHTTPRequestHandler):
    """Stands in for the router at the network edge: records the body, streams fixed SSE."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        StubRouter.received.append({"path": self.path, "body": json.loads(self.rfile.read(length)),
                                    "request_id": self.headers.get("X-Request-Id")})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in SSE:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stub_router(deployment: Deployment) -> Iterator[list[dict[str, Any]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubRouter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Deployment.objects.filter(pk=deployment.pk).update(router_port=server.server_address[1])
    StubRouter.received = []
    yield StubRouter.received
    server.shutdown()
    server.server_close()


@pytest.mark.django_db(transaction=True)
async def test_chat_streams_through_the_router(owner: User, deployment: Deployment,
                                               stub_router: list[dict[str, Any]]) -> None:
    client = AsyncClient()
    await client.aforce_login(owner)
    response = await client.post(
        f"/api/v1/deployments/{deployment.pk}/chat", content_type="application/json",
        data={"messages": [{"role": "user", "content": "capital of France?"}], "max_tokens": 8})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    body = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert '"Paris"' in body and body.rstrip().endswith("data: [DONE]")
    [sent] = stub_router
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["model"] == "smollm2"
    assert sent["body"]["stream"] is True
    assert sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["request_id"] == response["X-Request-Id"]


@pytest.mark.django_db(transaction=True)
async def test_chat_to_a_router_that_is_down_ends_with_an_error_event(
        owner: User, deployment: Deployment) -> None:
    await Deployment.objects.filter(pk=deployment.pk).aupdate(router_port=1)
    client = AsyncClient()
    await client.aforce_login(owner)
    response = await client.post(f"/api/v1/deployments/{deployment.pk}/chat",
                                 content_type="application/json",
                                 data={"messages": [{"role": "user", "content": "hi"}]})
    body = b"".join([chunk async for chunk in response.streaming_content]).decode()
    assert "cannot reach the router" in json.loads(body.removeprefix("data: "))["error"]["message"]


@pytest.mark.parametrize(("payload", "field"), [
    ("not json", "body"),
    ("[]", "body"),
    ('{"messages": "hi"}', "messages"),
    ('{"messages": [{"role": "user"}]}', "messages"),
    ('{"messages": [{"role": "user", "content": "hi"}], "n": 3}', "n"),
    ('{"messages": []}', "messages"),
    ('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens"),
    ('{"messages": [{"role": "user", "content": "hi"}], "stop": [1]}', "stop"),
])
def test_bad_chat_input_names_the_field(owner: User, deployment: Deployment, payload: str,
                                        field: str) -> None:
    client = Client()
    client.force_login(owner)
    response = client.post(f"/api/v1/deployments/{deployment.pk}/chat", data=payload,
                           content_type="application/json")
    assert response.status_code == 400
    assert field in response.json()


def test_chat_needs_a_sign_in(deployment: Deployment) -> None:
    response = Client().post(f"/api/v1/deployments/{deployment.pk}/chat", data="{}",
                             content_type="application/json")
    assert response.status_code == 401
    assert Client().get(f"/deployments/{deployment.name}/playground/").status_code == 302


def test_chat_errors_are_json_whatever_the_client_accepts(owner: User,
                                                         deployment: Deployment) -> None:
    client = Client()
    client.force_login(owner)
    response = client.post(f"/api/v1/deployments/{deployment.pk}/chat/", data="{}",
                           content_type="application/json", headers={"accept": "text/event-stream"})
    assert response.status_code == 400
    assert "messages" in response.json()
    assert client.post("/api/v1/deployments/999999/chat", data="{}",
                       content_type="application/json").status_code == 404


def test_chat_checks_the_sessions_csrf_token(owner: User, deployment: Deployment) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    url = f"/api/v1/deployments/{deployment.pk}/chat"
    refused = client.post(url, data="{}", content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    client.get(f"/deployments/{deployment.name}/playground/")  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    checked = client.post(url, data="{}", content_type="application/json",
                          headers={"x-csrftoken": token})
    assert checked.status_code == 400 and "messages" in checked.json()


def test_chat_is_in_the_api_schema(owner: User) -> None:
    client = Client()
    client.force_login(owner)
    schema = client.get("/api/schema/", {"format": "json"}).json()
    [chat] = [ops["post"] for path, ops in schema["paths"].items() if path.endswith("/chat/")]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatRequest"}
    assert list(chat["responses"]["200"]["content"]) == ["text/event-stream"]
    assert set(schema["components"]["schemas"]["ChatRequest"]["properties"]) == {
        "messages", "max_tokens", "temperature", "top_p", "seed", "stop"}


def test_playground_page(owner: User, deployment: Deployment) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(f"/deployments/{deployment.name}/playground/").content.decode()
    assert f"/api/v1/deployments/{deployment.pk}/chat" in page


def _process(deployment: Deployment, slot: str, role: str) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                         log_path="/nonexistent.log")


def test_a_request_is_found_in_the_router_timeline_and_the_worker_logs(
        owner: User, deployment: Deployment) -> None:
    router = _process(deployment, "router", "router")
    decode = _process(deployment, "decode-0", "decode")
    timeline = {"request_id": "req-42", "endpoint": "chat", "status": 200, "error": None,
                "events_ms": {"received": 0.0, "prefill_dispatched": 1.5, "prefill_done": 80.0,
                              "decode_dispatched": 81.0, "first_token": 120.0,
                              "last_token": 900.0},
                "prefill": "http://127.0.0.1:8100", "decode": "http://127.0.0.1:8200",
                "prompt_tokens": 37, "completion_tokens": 8, "stream_chunks": 10, "kv": {}}
    now = timezone.now()
    LogStore().write([
        CapturedLine(decode.pk, "INFO Received request chatcmpl-req-42-0: prompt ...", now),
        CapturedLine(decode.pk, "INFO Received request chatcmpl-other-0", now),
        CapturedLine(router.pk, "2026 INFO pdserve.router.timeline timeline "
                     + json.dumps(timeline), now),
    ])
    view = find_request(deployment.pk, "req-42")
    assert view.timeline is not None and view.timeline["prompt_tokens"] == 37
    assert [name for name, _, _ in view.steps()] == [
        "received", "prefill_dispatched", "prefill_done", "decode_dispatched", "first_token",
        "last_token"]
    assert view.steps()[2] == ("prefill_done", 80.0, 78.5)
    assert [(slot, line.text) for slot, line in view.lines] == [
        ("decode-0", "INFO Received request chatcmpl-req-42-0: prompt ...")]

    client = Client()
    client.force_login(owner)
    page = client.get(f"/deployments/{deployment.name}/requests/?id=req-42").content.decode()
    assert 'data-event="first_token"' in page
    assert "chatcmpl-req-42-0" in page
    assert "chatcmpl-other" not in page


def test_the_request_page_looks_again_until_the_timeline_is_written(
        owner: User, deployment: Deployment) -> None:
    router = _process(deployment, "router", "router")
    client = Client()
    client.force_login(owner)
    page = client.get(f"/deployments/{deployment.name}/requests/?id=req-late").content.decode()
    # Not written yet (the router logs it when the request ends): the page re-fetches its part.
    assert "No router timeline found" in page
    assert (f'data-refresh-url="/deployments/{deployment.name}/requests/?id=req-late&amp;'
            'partial=1"') in page
    partial = client.get(f"/deployments/{deployment.name}/requests/",
                         {"id": "req-late", "partial": "1"}).content.decode()
    assert "<html" not in partial and "data-refresh-stop" not in partial

    timeline = {"request_id": "req-late", "endpoint": "completions", "status": 200,
                "error": None, "events_ms": {"received": 0.0, "first_token": 12.0},
                "prefill": None, "decode": None, "prompt_tokens": 3, "completion_tokens": 1,
                "stream_chunks": 0, "kv": {}}
    LogStore().write([CapturedLine(router.pk, "2026 INFO pdserve.router.timeline timeline "
                                   + json.dumps(timeline), timezone.now())])
    partial = client.get(f"/deployments/{deployment.name}/requests/",
                         {"id": "req-late", "partial": "1"}).content.decode()
    # Found: the fragment tells the page to stop asking.
    assert 'data-event="first_token"' in partial and "data-refresh-stop" in partial
    page = client.get(f"/deployments/{deployment.name}/requests/?id=req-late").content.decode()
    assert "data-refresh-url" not in page and 'data-event="first_token"' in page
