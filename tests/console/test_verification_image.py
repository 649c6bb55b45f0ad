"""The verification's image request (console/verification/image_check.py) against stand-ins on
real sockets: a router that answers chat requests, counting an image's tokens into the prompt
and "prefilling" on the prefill worker (its prompt-token counter grows), and a prefill worker
that answers /metrics with its key. A VLM whose image becomes tokens computed in prefill
passes; an image that adds no tokens fails, and so does a prefill counter that stays where it
was; a router that refuses images fails naming its answer; a text-only model's row says the check
does not apply. The check is in the report's page, its API and its HTML export."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from PIL import Image
from rest_framework.test import APIClient

from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.supervisor.worker_keys import deployment_worker_key
from console.verification import image_check
from console.verification.image_check import NAME, image_request, sample_png
from console.verification.models import VerificationReport
from console.verification.subject import subject_of
from console.verification.verdicts import Section
from inference.router.asked_placement import PLACEMENT_HEADER
from tests.console.sockets import free_port
from tests.json_handler import JsonHandler

pytestmark = pytest.mark.django_db
TEXT_TOKENS = 12


class PrefillStandIn(ThreadingHTTPServer):
    """A vLLM prefill worker's /metrics: ``prompt_tokens`` in vllm:prompt_tokens_total."""

    def __init__(self, port: int, key: str) -> None:
        self.key, self.prompt_tokens = key, 1000.0
        super().__init__(("127.0.0.1", port), _PrefillHandler)


class _PrefillHandler(JsonHandler):
    server: PrefillStandIn

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != f"Bearer {self.server.key}":
            self.send_json(401, {"error": "no key"})
        elif self.path == "/metrics":
            self.send_bytes(200, (
                "# TYPE vllm:prompt_tokens_total counter\n"
                f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} '
                f"{self.server.prompt_tokens}\n").encode())
        else:
            self.send_json(404, {})


class RouterStandIn(ThreadingHTTPServer):
    """Chat answers with usage: the text's tokens plus ``image_tokens`` per image; each prompt
    "prefilled" on ``prefill`` (its counter grows by the prompt) while ``prefills`` is set;
    ``refuse``: an image request is answered 400 as a router without --max-images does."""

    def __init__(self, port: int, prefill: PrefillStandIn) -> None:
        self.prefill, self.image_tokens, self.prefills, self.refuse = prefill, 64, True, False
        self.received: list[tuple[dict[str, Any], dict[str, str]]] = []
        super().__init__(("127.0.0.1", port), _RouterHandler)


class _RouterHandler(JsonHandler):
    server: RouterStandIn

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((body, dict(self.headers)))
        content = body["messages"][-1]["content"]
        images = [p for p in content if p["type"] == "image_url"] if isinstance(content,
                                                                                 list) else []
        if images and self.server.refuse:
            self.send_json(400, {"error": {"message": "this model accepts no images",
                                           "param": "messages[0].content[1]"}})
            return
        prompt = TEXT_TOKENS + self.server.image_tokens * len(images)
        if self.server.prefills:
            self.server.prefill.prompt_tokens += prompt
        self.send_json(200, {"choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": " a red square"}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 8}})


class Stack:
    def __init__(self, deployment: Deployment) -> None:
        ports = {"router": free_port(), "prefill-0": free_port(), "decode-0": free_port()}
        Deployment.objects.filter(pk=deployment.pk).update(router_port=ports["router"])
        for worker in deployment.workers.all():
            worker.port = ports[worker.slot]
            worker.save(update_fields=["port"])
        deployment.refresh_from_db()
        self.deployment = deployment
        self.prefill = PrefillStandIn(ports["prefill-0"], deployment_worker_key(deployment.name))
        self.router = RouterStandIn(ports["router"], self.prefill)
        for server in (self.prefill, self.router):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.prefill, self.router):
            server.shutdown()
            server.server_close()


@pytest.fixture
def stack(deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setattr(image_check, "COUNTER_WAIT_S", 0.3)
    Variant.objects.filter(workers__deployment=deployment).update(modalities=["text", "image"])
    built = Stack(deployment)
    yield built
    built.close()


def _run(stack: Stack) -> dict[str, Any]:
    section = Section("function")
    with httpx.Client(timeout=10) as client:
        image_request(subject_of(stack.deployment), section, client)
    [check] = section.as_dict()["checks"]
    assert check["name"] == NAME
    return check


def test_an_image_that_becomes_tokens_computed_in_prefill_passes(stack: Stack) -> None:
    check = _run(stack)
    assert check["verdict"] == "pass", check["detail"]
    evidence = check["evidence"]
    assert evidence["prompt_tokens"] == TEXT_TOKENS + 64
    assert evidence["prompt_tokens_without_image"] == TEXT_TOKENS
    assert evidence["image_tokens"] == 64
    assert evidence["prefill_counter_growth"] == TEXT_TOKENS + 64
    assert "the vision module ran in prefill" in check["detail"]
    # Two requests, each placed on a prefill worker; the second with the PNG as a data URL.
    (text_body, text_headers), (image_body, image_headers) = stack.router.received
    assert {text_headers[PLACEMENT_HEADER], image_headers[PLACEMENT_HEADER]} == {"remote"}
    assert text_body["messages"][0]["content"] == image_check.QUESTION
    [_, part] = image_body["messages"][0]["content"]
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    decoded = base64.b64decode(url.split(",", 1)[1])
    assert decoded == sample_png()
    assert Image.open(io.BytesIO(decoded)).size == (image_check.IMAGE_SIDE,) * 2


def test_an_image_that_adds_no_tokens_fails(stack: Stack) -> None:
    stack.router.image_tokens = 0
    check = _run(stack)
    assert check["verdict"] == "fail"
    assert "the image added no prompt tokens" in check["detail"]
    assert check["evidence"]["image_tokens"] == 0


def test_a_prefill_counter_that_does_not_grow_fails(stack: Stack) -> None:
    stack.router.prefills = False  # decode computed it, or nothing did
    check = _run(stack)
    assert check["verdict"] == "fail"
    assert "was not computed in prefill" in check["detail"]
    assert check["evidence"]["prefill_counter_growth"] == 0


def test_a_router_that_refuses_images_fails_naming_its_answer(stack: Stack) -> None:
    stack.router.refuse = True
    check = _run(stack)
    assert check["verdict"] == "fail"
    assert "the image request answered 400" in check["detail"]
    assert "this model accepts no images" in check["detail"]


def test_a_prefill_worker_whose_counter_cannot_be_read_leaves_it_unknown(stack: Stack) -> None:
    stack.prefill.key = "another key"
    check = _run(stack)
    assert check["verdict"] == "warn"
    assert "prefill-0 /metrics answered 401" in check["detail"]


def test_a_text_only_model_is_not_applicable_and_says_why(stack: Stack) -> None:
    Variant.objects.filter(workers__deployment=stack.deployment).update(modalities=["text"])
    section = Section("function")
    with httpx.Client(timeout=10) as client:
        image_request(subject_of(stack.deployment), section, client)
    [check] = section.checks
    assert check.verdict == "n/a"
    assert "not applicable" in check.detail and "takes text only" in check.detail
    assert stack.router.received == []
    # It counts toward no verdict, and the summary says it did not apply.
    assert section.verdict == "pass"
    section.add("plain completion", "pass", "ok")
    assert section.summary == "1 checks passed, 1 not applicable"


def test_a_plan_that_lets_no_image_through_is_not_applicable(stack: Stack) -> None:
    Deployment.objects.filter(pk=stack.deployment.pk).update(max_images_per_prompt=0)
    stack.deployment.refresh_from_db()
    check = _run(stack)
    assert check["verdict"] == "n/a"
    assert "the plan lets no image through the router" in check["detail"]
    assert stack.router.received == []


def test_one_text_only_variant_makes_the_check_not_applicable(stack: Stack) -> None:
    """Prefill and decode both read the images: a plan with one text-only variant takes none."""
    decode = stack.deployment.workers.get(role="decode")
    text_only = Variant.objects.create(base=decode.variant.base, name="text-only",
                                       path="/nonexistent/text-only", modalities=["text"])
    stack.deployment.workers.filter(role="decode").update(variant=text_only)
    assert subject_of(stack.deployment).modalities == ("text",)
    assert _run(stack)["verdict"] == "n/a"


def test_the_check_is_in_the_page_the_api_and_the_export(stack: Stack, owner: User) -> None:
    section = Section("function")
    with httpx.Client(timeout=10) as client:
        image_request(subject_of(stack.deployment), section, client)
        Variant.objects.filter(workers__deployment=stack.deployment).update(modalities=["text"])
        image_request(subject_of(stack.deployment), section, client)
    report = VerificationReport.objects.create(
        deployment=stack.deployment, trigger="demand", state="done", verdict="pass", budget_s=60,
        sections=[section.as_dict()])
    passed, skipped = section.checks

    client = Client()
    client.force_login(owner)
    for url in (f"/verifications/{report.pk}/", f"/verifications/{report.pk}/panel/"):
        page = client.get(url).content.decode()
        assert f'data-check="{NAME}"' in page
        assert passed.detail.replace("'", "&#x27;") in page
        assert f"prompt tokens {TEXT_TOKENS + 64} with the 64x64 image, {TEXT_TOKENS} without" \
            in page
        assert "not applicable" in page and "takes text only" in page

    api = APIClient()
    api.force_authenticate(owner)
    detail = api.get(f"/api/v1/verifications/{report.pk}/").json()
    [function] = detail["sections"]
    assert [(c["name"], c["verdict"]) for c in function["checks"]] == [(NAME, "pass"),
                                                                       (NAME, "n/a")]
    assert function["checks"][0]["evidence"]["image_tokens"] == 64

    html = api.get(f"/api/v1/verifications/{report.pk}/export.html").content.decode()
    assert f'<tr class="pass" data-check="{NAME}">' in html
    assert f'<tr class="na" data-check="{NAME}">' in html
    assert "prefill's prompt-token counter +76" in html
    assert skipped.verdict == "n/a"
