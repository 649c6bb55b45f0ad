"""Function, for a model that takes images: one chat request with a small generated PNG through
the router. It passes when the answer is 200 with text, when its prompt counts more tokens than
the same request without the image (the image became tokens), and, in PD mode, when the prefill
workers' prompt-token counter (vLLM's ``vllm:prompt_tokens_total``) grew by at least the image
request's prompt tokens: the vision module ran in prefill, not only on decode. Both requests name
their placement (remote), so that the router prefills them on a prefill worker whatever its
policy would do with a prompt that short. For a text-only model the check is not applicable,
and its row says so."""

from __future__ import annotations

import base64
import io
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from PIL import Image, ImageDraw

from console.verification.subject import Subject
from console.verification.verdicts import FAIL, NOT_APPLICABLE, PASS, WARN, Section
from inference.prom_snapshot import PROMPT_TOKENS, parse
from inference.router.asked_placement import PLACEMENT_HEADER
from inference.worker_auth import bearer

NAME = "image request"
QUESTION = "Describe this image in one sentence."
MAX_TOKENS = 8
IMAGE_SIDE = 64
# vLLM updates its counters as it hands a request's output back; the answer may come first.
COUNTER_WAIT_S = 3.0
COUNTER_POLL_S = 0.2


def sample_png(side: int = IMAGE_SIDE) -> bytes:
    """A small PNG with something to see: a gradient, a red square and a blue disc."""
    image = Image.new("RGB", (side, side))
    image.putdata([(x * 255 // side, y * 255 // side, 128) for y in range(side)
                   for x in range(side)])
    draw = ImageDraw.Draw(image)
    draw.rectangle((side // 8, side // 8, side // 2, side // 2), fill=(220, 30, 30))
    draw.ellipse((side // 2, side // 2, side - side // 8, side - side // 8), fill=(30, 30, 220))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def chat_body(model: str, image: bytes | None) -> dict[str, Any]:
    """The chat request, with the image as a data URL after the question, or the question
    alone."""
    content: str | list[dict[str, Any]] = QUESTION
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
        content = [{"type": "text", "text": QUESTION},
                   {"type": "image_url", "image_url": {"url": url}}]
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


@dataclass
class Answer:
    request_id: str
    status: int | None = None
    prompt_tokens: int | None = None
    text: str = ""
    error: str = ""


def ask(client: httpx.Client, subject: Subject, body: dict[str, Any], request_id: str) -> Answer:
    answer = Answer(request_id)
    headers = {**bearer(subject.api_key), "X-Request-Id": request_id}
    if subject.mode == "pd":
        headers[PLACEMENT_HEADER] = "remote"
    try:
        response = client.post(f"{subject.router_url}/v1/chat/completions", json=body,
                               headers=headers)
    except httpx.HTTPError as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
        return answer
    answer.status = response.status_code
    if response.status_code != 200:
        answer.error = f"answered {response.status_code}: {response.text[:300]}"
        return answer
    try:
        payload = response.json()
        answer.prompt_tokens = int(payload["usage"]["prompt_tokens"])
        answer.text = str(payload["choices"][0]["message"]["content"] or "")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        answer.error = f"answered 200 without usage.prompt_tokens and a message: {exc!r}"
    return answer


def prefill_counter(client: httpx.Client, subject: Subject) -> tuple[float | None, str]:
    """The prefill workers' ``vllm:prompt_tokens_total``, summed (they answer /metrics with the
    deployment's worker key), and "" ; or (None, why it could not be read)."""
    total = 0.0
    for worker in subject.role("prefill"):
        try:
            response = client.get(f"{worker.url}/metrics", headers=bearer(subject.worker_key))
        except httpx.HTTPError as exc:
            return None, f"{worker.slot} /metrics: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return None, f"{worker.slot} /metrics answered {response.status_code}"
        try:
            value = parse(response.text, time.monotonic()).sum(PROMPT_TOKENS)
        except ValueError as exc:
            return None, f"{worker.slot} /metrics is not Prometheus text: {exc}"
        if value is None:
            return None, f"{worker.slot} /metrics has no {PROMPT_TOKENS}"
        total += value
    return total, ""


def image_request(subject: Subject, section: Section, client: httpx.Client) -> None:
    if not subject.takes_images:
        why = (f"{subject.model} takes {' and '.join(subject.modalities)} only (its variants' "
               "modalities)" if "image" not in subject.modalities else
               "the plan lets no image through the router (max_images_per_prompt 0)")
        section.add(NAME, NOT_APPLICABLE, f"not applicable: {why}, so no image request was sent",
                    modalities=list(subject.modalities), max_images=subject.max_images)
        return
    prefix = f"verify-image-{uuid.uuid4().hex[:8]}"
    image = sample_png()
    text_only = ask(client, subject, chat_body(subject.model, None), f"{prefix}-text")
    if text_only.error:
        section.add(NAME, FAIL, f"the same request without the image {text_only.error}",
                    request_id=text_only.request_id)
        return
    in_pd = subject.mode == "pd" and bool(subject.role("prefill"))
    before, unread = prefill_counter(client, subject) if in_pd else (None, "")
    answer = ask(client, subject, chat_body(subject.model, image), f"{prefix}-image")
    evidence: dict[str, Any] = {
        "request_id": answer.request_id, "image_bytes": len(image),
        "image_size": [IMAGE_SIDE, IMAGE_SIDE], "answer": answer.text[:200],
        "prompt_tokens": answer.prompt_tokens, "prompt_tokens_without_image":
            text_only.prompt_tokens}
    if answer.error:
        section.add(NAME, FAIL, f"the image request {answer.error}", **evidence)
        return
    if not answer.text:
        section.add(NAME, FAIL, "the image request answered 200 with no text", **evidence)
        return
    # Both set: ask() gives an answer without an error only with its prompt tokens.
    image_tokens = (answer.prompt_tokens or 0) - (text_only.prompt_tokens or 0)
    evidence["image_tokens"] = image_tokens
    if image_tokens <= 0:
        section.add(NAME, FAIL, f"the image added no prompt tokens ({answer.prompt_tokens} with "
                    f"it, {text_only.prompt_tokens} without): the model did not see it",
                    **evidence)
        return
    counted = f"{answer.prompt_tokens} prompt tokens, {image_tokens} of them the image's"
    if not in_pd:
        section.add(NAME, PASS, f"answered with text; {counted} (colocated: one worker "
                    "computes the whole request)", **evidence)
        return
    grown: float | None = None
    if before is not None:
        grown, unread = _growth(client, subject, before, answer.prompt_tokens or 0)
    evidence.update(prefill_counter_before=before, prefill_counter_growth=grown)
    if grown is None:
        section.add(NAME, WARN, f"answered with text; {counted}; whether prefill computed it is "
                    f"unknown: {unread}", **evidence)
    elif grown < (answer.prompt_tokens or 0):
        section.add(NAME, FAIL, f"prefill's {PROMPT_TOKENS} grew by {grown:.0f}, less than the "
                    f"image request's {answer.prompt_tokens} prompt tokens: the image was not "
                    "computed in prefill", **evidence)
    else:
        section.add(NAME, PASS, f"answered with text; {counted}; prefill's {PROMPT_TOKENS} grew "
                    f"by {grown:.0f}: the vision module ran in prefill", **evidence)


def _growth(client: httpx.Client, subject: Subject, before: float,
            wanted: int) -> tuple[float | None, str]:
    """How much the prefill counter grew since ``before``, waiting a little for ``wanted``."""
    deadline = time.monotonic() + COUNTER_WAIT_S
    while True:
        after, unread = prefill_counter(client, subject)
        if after is None:
            return None, unread
        # A counter that went backwards: a prefill worker restarted meanwhile.
        grown = after - before if after >= before else after
        if grown >= wanted or time.monotonic() >= deadline:
            return grown, ""
        time.sleep(COUNTER_POLL_S)
