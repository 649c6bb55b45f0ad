"""The router as a drop-in for vLLM: the same request shapes go to one plain vLLM server (the
stack's single server: its prefill worker, asked for the whole answer) and to the router in
front of the default deployment's prefill/decode pair. Status and error type must match; for
greedy requests, the tokens too. A shape that differs must be listed, with its reason, in the
README's compatibility table, and a listed shape must still differ (the list cannot go stale)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_default_deployment import LONG_PROMPT, QUESTION

pytestmark = pytest.mark.vllm

README = Path(__file__).resolve().parents[2] / "README.md"
M = "smollm2"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "Name three colours."}]
SYSTEM = QUESTION
SAMPLED = {"temperature": 0.8, "seed": 7}
JSON_SCHEMA = {"type": "object", "properties": {"colour": {"type": "string",
                                                           "enum": ["red", "green", "blue"]}},
               "required": ["colour"]}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    body: Any
    # tokens: a greedy request, whose answer must be the reference's; choices: a sampled
    # one, whose status and number of choices must match; status: status and error type.
    compare: str = "tokens"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": M, "prompt": "The three primary colours are", "max_tokens": 8, **extra}


def chat(messages: list[dict[str, Any]] = USER, **extra: Any) -> dict[str, Any]:
    return {"model": M, "messages": messages, "max_tokens": 8, **extra}


SHAPES = [
    # ---- /v1/completions
    Shape("completion", COMPLETIONS, completion()),
    Shape("completion streamed", COMPLETIONS, completion(stream=True)),
    Shape("completion streamed with usage", COMPLETIONS,
          completion(stream=True, stream_options={"include_usage": True})),
    Shape("completion without a model", COMPLETIONS,
          {"prompt": "The three primary colours are", "max_tokens": 8}),
    Shape("prompt as a list of one string", COMPLETIONS,
          completion(prompt=["The three primary colours are"])),
    Shape("prompt as token ids", COMPLETIONS, completion(prompt=[504, 1392, 3923, 5301, 359])),
    Shape("batch of string prompts", COMPLETIONS,
          completion(prompt=["The sky is", "Grass is"])),
    Shape("batch of token-id prompts", COMPLETIONS,
          completion(prompt=[[504, 1392, 3923], [504, 1392]])),
    Shape("long prompt (KV hand-off)", COMPLETIONS, completion(prompt=LONG_PROMPT, max_tokens=16)),
    Shape("echo", COMPLETIONS, completion(echo=True)),
    Shape("echo with logprobs", COMPLETIONS, completion(echo=True, logprobs=2)),
    Shape("logprobs", COMPLETIONS, completion(logprobs=3)),
    Shape("stop strings", COMPLETIONS, completion(stop=[","], max_tokens=16)),
    Shape("min_tokens", COMPLETIONS, completion(min_tokens=6, max_tokens=8)),
    Shape("structured outputs (choice)", COMPLETIONS,
          completion(structured_outputs={"choice": ["red", "green"]})),
    Shape("seeded sampling", COMPLETIONS, completion(**SAMPLED), compare="choices"),
    Shape("n=2 sampled", COMPLETIONS, completion(n=2, **SAMPLED), compare="choices"),
    Shape("n=2 greedy", COMPLETIONS, completion(n=2, temperature=0), compare="status"),
    Shape("best_of=2", COMPLETIONS, completion(best_of=2, **SAMPLED), compare="status"),
    Shape("max_tokens 0", COMPLETIONS, completion(max_tokens=0), compare="status"),
    Shape("max_tokens beyond the context", COMPLETIONS, completion(max_tokens=5000),
          compare="status"),
    Shape("prompt beyond the context", COMPLETIONS, completion(prompt="word " * 3000),
          compare="status"),
    Shape("negative temperature", COMPLETIONS, completion(temperature=-1), compare="status"),
    Shape("unknown model", COMPLETIONS, completion(model="nope"), compare="status"),
    Shape("no prompt", COMPLETIONS, {"model": M}, compare="status"),
    Shape("empty prompt list", COMPLETIONS, completion(prompt=[]), compare="status"),
    Shape("body that is not an object", COMPLETIONS, [completion()], compare="status"),
    # ---- /v1/chat/completions
    Shape("chat", CHAT, chat()),
    Shape("chat with a system prompt", CHAT, chat(SYSTEM)),
    Shape("chat streamed with usage", CHAT,
          chat(stream=True, stream_options={"include_usage": True})),
    Shape("chat content as a text part", CHAT,
          chat([{"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}])),
    Shape("chat content as two text parts", CHAT, chat([{"role": "user", "content": [
        {"type": "text", "text": "Name three"}, {"type": "text", "text": "colours."}]}])),
    Shape("chat with an image part (text-only model)", CHAT, chat([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]),
          compare="status"),
    Shape("chat long conversation (KV hand-off)", CHAT,
          chat([{"role": "user", "content": LONG_PROMPT}], max_tokens=16)),
    Shape("chat logprobs", CHAT, chat(logprobs=True, top_logprobs=2)),
    Shape("chat max_completion_tokens", CHAT, chat(max_completion_tokens=6)),
    Shape("chat response_format json_schema", CHAT, chat(
        max_tokens=24, response_format={"type": "json_schema", "json_schema": {
            "name": "colour", "schema": JSON_SCHEMA}})),
    Shape("chat continue_final_message", CHAT, chat(
        [*USER, {"role": "assistant", "content": "Red, green and"}],
        add_generation_prompt=False, continue_final_message=True)),
    Shape("chat with a tool result message", CHAT, chat([
        *USER, {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "red, green, blue", "tool_call_id": "call_1"}])),
    Shape("chat with tools, tool_choice none", CHAT,
          chat(tools=[WEATHER_TOOL], tool_choice="none")),
    Shape("chat tool_choice auto without a parser", CHAT,
          chat(tools=[WEATHER_TOOL], tool_choice="auto"), compare="status"),
    Shape("chat n=2 sampled", CHAT, chat(n=2, **SAMPLED), compare="choices"),
    Shape("chat empty messages", CHAT, chat([]), compare="status"),
    Shape("chat message without a role", CHAT, chat([{"content": "hi"}]), compare="status"),
    # ---- other routes
    Shape("tokenize a prompt", "/tokenize", {"model": M, "prompt": "The sky is blue"}),
    Shape("tokenize chat messages", "/tokenize", {"model": M, "messages": SYSTEM}),
    Shape("detokenize", "/detokenize", {"model": M, "tokens": [504, 1392, 3923]}),
    Shape("an unknown route", "/v1/no-such-route", {"model": M}, compare="status"),
]


def outcome(response: httpx.Response, shape: Shape) -> dict[str, Any]:
    """What must match between the two servers for ``shape``."""
    seen: dict[str, Any] = {"status": response.status_code}
    if response.status_code >= 400:
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            error = None
        seen["error_type"] = error.get("type") if isinstance(error, dict) else None
        return seen
    if shape.compare == "status":
        return seen
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = streamed(response.text)
    else:
        data = response.json()
    if shape.compare == "choices":
        seen["choices"] = len(data["choices"])
        return seen
    if "choices" not in data:  # /tokenize, /detokenize
        return {**seen, "answer": data}
    seen["choices"] = [answer_of(choice) for choice in data["choices"]]
    if data.get("usage"):
        seen["usage"] = {k: data["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    return seen


def answer_of(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or [entry.get("token") for entry in logprobs.get("content") or []]
    return {"index": choice["index"], "text": choice.get("text", message.get("content")),
            "tool_calls": message.get("tool_calls") or None,
            "finish_reason": choice.get("finish_reason"), "logprob_tokens": tokens or None}


def streamed(text: str) -> dict[str, Any]:
    """A stream folded into one answer: each choice's text, its finish reason, the usage."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            folded = choices.setdefault(choice["index"], {"index": choice["index"], "text": ""})
            piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get(
                "content")
            folded["text"] += piece or ""
            if choice.get("finish_reason"):
                folded["finish_reason"] = choice["finish_reason"]
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage}


def send(base: str, shape: Shape, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.request(shape.method, f"{base}{shape.path}", json=shape.body, timeout=180,
                         headers={**(headers or {}), **shape.headers})


def listed_differences() -> dict[str, str]:
    """Shape name -> reason, from the README's table between the compat-differences markers."""
    text = README.read_text()
    section = text.split("<!-- compat-differences -->", 1)[1].split("<!-- /compat-differences -->")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    found = {}
    for row in rows[1:]:  # the first row is the header
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        found[cells[0].strip("`")] = cells[-1]
    return found


def test_the_matrix_has_at_least_30_shapes_with_unique_names() -> None:
    assert len(SHAPES) >= 30
    assert len({shape.name for shape in SHAPES}) == len(SHAPES)


def test_every_shape_answers_as_vllm_does_or_is_a_listed_difference(stack: Stack) -> None:
    listed = listed_differences()
    assert set(listed) <= {shape.name for shape in SHAPES}, "the README lists unknown shapes"
    differences: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for shape in SHAPES:
        if shape.compare == "tokens":
            # A prefilled prompt reaches decode as a prefix-cache hit would: the reference
            # answers from its warm prefix cache too (see test_default_deployment).
            send(stack.reference, shape, stack.reference_headers)
        reference = outcome(send(stack.reference, shape, stack.reference_headers), shape)
        routed = outcome(send(stack.router, shape), shape)
        if reference != routed:
            differences[shape.name] = (reference, routed)
    unlisted = {name: pair for name, pair in differences.items() if name not in listed}
    assert not unlisted, "differences not in the README:\n" + "\n".join(
        f"{name}:\n  vLLM:   {pair[0]}\n  router: {pair[1]}" for name, pair in unlisted.items())
    stale = sorted(set(listed) - set(differences))
    assert not stale, f"the README lists differences that are gone: {stale}"
    for name, reason in listed.items():
        assert re.search(r"\w{4}", reason), f"{name}: the README gives no reason"
