"""Tool calls served through PD: one prefill and one decode worker started with the plan's tool
options (hermes parser, auto tool choice, a chat template of the plan's own: tests/e2e/tiny_pd.py)
and a router in front with the same template.

The tiny random-weight Llama's text is noise, so what is asserted about calls comes from the
requests vLLM answers under a grammar whatever the weights: tool_choice "required" and a named
tool. "auto" is only asserted to be accepted, and refused by a worker started without
--enable-auto-tool-choice (the other prefill worker, asked directly), which refuses forced calls
too.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.sockets import free_port
from tests.e2e.conftest import _wait_http
from tests.e2e.test_failover import metric, wait_healthy
from tests.e2e.tiny_pd import TEMPLATE, TinyPD

pytestmark = pytest.mark.vllm

CITIES = ["Paris", "Rome", "Oslo"]
# "strict": vLLM's grammar then holds the arguments to the schema too, not only the call's
# envelope; with the cities an enum, random weights cannot ramble inside them.
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": name, "description": f"the {what} in a city", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                       "required": ["city"], "additionalProperties": False}}}
    for name, what in (("get_weather", "weather"), ("get_time", "time"))
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@dataclass
class ToolStack:
    router: str
    plain: str  # a worker without --enable-auto-tool-choice
    logs: Path
    # Sampling that lets a forced call end: vLLM's grammar allows any whitespace inside the
    # arguments, and greedy random weights pick it forever (seen: 200 tokens of spaces after
    # "{"). Tokens that are only whitespace are biased away; the grammar does the rest.
    forced: dict[str, Any]


def no_whitespace_tokens(model: Path) -> dict[str, Any]:
    # Imported here, as tests/tiny_llama.py does, so that collecting the suite stays quick.
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(str(model)).backend_tokenizer
    spaces = [i for i in range(vocab.get_vocab_size())
              if (text := vocab.decode([i], skip_special_tokens=False)) and not text.strip()]
    # One call: without more the grammar lets calls follow one another up to max_tokens.
    return {"logit_bias": {str(i): -100 for i in spaces}, "parallel_tool_calls": False}


@pytest.fixture(scope="module")
def tools(tiny_pd: TinyPD) -> ToolStack:
    """A router with the plan's template in front of the session's tiny prefill-a and decode
    (prefill-b, without auto tool choice, is the plain worker); it goes with the workers."""
    port = free_port()
    process = tiny_pd.spawn("router-tools", [
        sys.executable, "-m", "inference.router", "--served-model-name", "tiny",
        "--tokenizer", str(tiny_pd.model), "--max-model-len", "2048", "--port", str(port),
        "--prefill", tiny_pd.url("prefill-a"), "--decode", tiny_pd.url("decode"),
        "--chat-template", str(TEMPLATE),
        # Every prompt through prefill: the hand-off is what is under test.
        "--pd-policy", "remote", "--local-prefill-max-tokens", "0",
    ], {})
    router = f"http://127.0.0.1:{port}"
    _wait_http(f"{router}/health", 60, process)
    wait_healthy(router)
    return ToolStack(router=router, plain=tiny_pd.url("prefill-b"), logs=tiny_pd.logs,
                     forced=no_whitespace_tokens(tiny_pd.model))


def chat(base: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": "tiny", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200,
        "temperature": 0, **body})


def assert_call(name: str, arguments: str, wanted: str | None = None) -> None:
    assert name in {t["function"]["name"] for t in TOOLS}
    if wanted is not None:
        assert name == wanted
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"arguments are not JSON: {arguments!r}") from exc
    assert set(parsed) == {"city"} and parsed["city"] in CITIES, parsed


def test_auto_tool_choice_is_accepted_through_pd(tools: ToolStack) -> None:
    response = chat(tools.router, tool_choice="auto", max_tokens=16)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_tool_call_names_a_tool_with_arguments_matching_its_schema(
        tools: ToolStack, choice: str) -> None:
    wanted = "get_time" if choice == "named" else None
    tool_choice: Any = ({"type": "function", "function": {"name": wanted}}
                        if choice == "named" else "required")
    response = chat(tools.router, tool_choice=tool_choice, **tools.forced)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message.get("tool_calls"), message
    call = message["tool_calls"][0]
    assert call["type"] == "function"
    assert_call(call["function"]["name"], call["function"]["arguments"], wanted)


@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_streamed_tool_call_arrives_as_deltas(tools: ToolStack, choice: str) -> None:
    wanted = "get_weather" if choice == "named" else None
    tool_choice: Any = ({"type": "function", "function": {"name": wanted}}
                        if choice == "named" else "required")
    names, arguments = [], ""
    with httpx.stream("POST", f"{tools.router}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200,
            "temperature": 0, "stream": True, "tool_choice": tool_choice,
            **tools.forced}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice_delta in json.loads(line.removeprefix("data: "))["choices"]:
                for delta in choice_delta["delta"].get("tool_calls") or []:
                    if delta.get("index", 0) != 0:
                        continue
                    function = delta.get("function") or {}
                    if function.get("name"):
                        names.append(function["name"])
                    arguments += function.get("arguments") or ""
    assert len(names) == 1, names  # the name comes once, the arguments in pieces
    assert_call(names[0], arguments, wanted)


def test_a_worker_without_auto_tool_choice_refuses_auto(tools: ToolStack) -> None:
    response = chat(tools.plain, tool_choice="auto", max_tokens=4)
    assert response.status_code == 400, response.text
    assert "--enable-auto-tool-choice" in response.json()["error"]["message"]
    # vLLM 0.32 loads no tool parser at all without the flag (parser/parser_manager.py), so a
    # forced call is refused too: what the tools.parsers check warns about.
    forced = chat(tools.plain, tool_choice="required", max_tokens=4)
    assert forced.status_code == 400, forced.text
    assert "--tool-call-parser" in forced.json()["error"]["message"]


def test_every_chat_was_handed_over_from_prefill_to_decode(tools: ToolStack) -> None:
    # Decode found prefill's KV for each request through the router (the tests above), and
    # rendered the prompt prefill computed: the router fell back to recomputing none of them.
    routed = metric(tools.router, "pdserve_router_requests_total", {"role": "prefill+decode"})
    hits = (tools.logs / "decode.log").read_text(errors="replace").count("External Cache Hit!")
    assert routed >= 5 and hits >= 5, (routed, hits)
    assert metric(tools.router, "pdserve_router_pd_fallback_total") == 0
