"""The default deployment end to end: real vLLM prefill and decode workers on the CPU, the
router, the console's API and the supervisor. Tests run in file order.
tests/e2e/test_rollout_under_load.py rolls the deployment out, kills its decode and stops it."""

from __future__ import annotations

import httpx
import psutil
import pytest
from openai import OpenAI

from tests.e2e.conftest import Stack
from tests.e2e.test_failover import metric
from tests.worker_key import worker_headers

pytestmark = pytest.mark.vllm

# The README's question. In bfloat16 the greedy answer needs the system prompt: without it
# "The" and "L" tie as the first token (see the README); with it each token leads by >= 0.875.
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]
# Long enough (> one 128-token KV block on the CPU backend) that prefill's KV really moves.
LONG_PROMPT = (
    "The following is a record of the river towns along the old trade route. "
    + " ".join(
        f"Town number {i} sits on the {('north', 'south', 'east', 'west')[i % 4]} bank, trades "
        f"in {('salt', 'wool', 'iron', 'grain', 'wine')[i % 5]}, and has {i * 37 % 900 + 100} people."
        for i in range(1, 41)
    )
    + " Summarize which goods the towns trade most:"
)


def _client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.router}/v1", api_key="unused", max_retries=0, timeout=120)


def _single(stack: Stack, path: str, body: dict) -> dict:
    """The whole answer from the single server (the prefill worker, tests/e2e/conftest.py)."""
    response = httpx.post(f"{stack.reference}{path}", json=body, headers=stack.reference_headers,
                          timeout=120)
    response.raise_for_status()
    return dict(response.json())


def test_api_shows_every_process_ready(stack: Stack) -> None:
    body = stack.deployment()
    assert body["state"] == "ready"
    processes = {p["slot"]: p for p in body["processes"]}
    assert set(processes) == {"prefill-0", "decode-0", "router"}
    for process in processes.values():
        assert process["state"] == "ready"
        assert psutil.pid_exists(process["pid"])
    assert processes["prefill-0"]["port"] == 8100
    assert processes["decode-0"]["port"] == 8200


def test_router_health_reports_both_roles(stack: Stack) -> None:
    body = httpx.get(f"{stack.router}/health").json()
    assert body["status"] == "ok"
    assert body["roles"]["prefill"]["ready"] == 1
    assert body["roles"]["decode"]["ready"] == 1


def test_chat_answers_paris(stack: Stack) -> None:
    answer = _client(stack).chat.completions.create(model="smollm2", messages=QUESTION,
                                                    max_tokens=24)
    assert "Paris" in answer.choices[0].message.content


def test_chat_streamed_answers_paris_and_keeps_request_id(stack: Stack) -> None:
    with httpx.stream("POST", f"{stack.router}/v1/chat/completions", timeout=120,
                      headers={"X-Request-Id": "e2e-stream-1"},
                      json={"model": "smollm2", "messages": QUESTION, "max_tokens": 24,
                            "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["X-Request-Id"] == "e2e-stream-1"
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) > 3  # streamed token by token, not one block
    client_stream = _client(stack).chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=24, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client_stream if chunk.choices)
    assert "Paris" in text


def test_completions_streamed_and_not(stack: Stack) -> None:
    client = _client(stack)
    plain = client.completions.create(model="smollm2", prompt="The capital of France is",
                                      max_tokens=4)
    assert "Paris" in plain.choices[0].text
    streamed = client.completions.create(model="smollm2", prompt="The capital of France is",
                                         max_tokens=4, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == plain.choices[0].text


def test_pd_output_equals_prefix_cached_single_server(stack: Stack) -> None:
    """Greedy PD output equals a single server's, token for token.

    Through PD, decode receives the prompt's KV (all whole blocks but the last token) and
    computes only the rest: exactly what a single server does on a prefix-cache hit. A cold
    single server instead computes the whole prompt in one pass, and that different batch
    shape changes bf16/fp32 accumulation order enough to flip near-tied tokens. So the
    reference sees the prompt once to warm its prefix cache, then answers for comparison.
    """
    body = {"model": "smollm2", "prompt": LONG_PROMPT, "max_tokens": 32,
            "return_token_ids": True, "temperature": 0}
    fallbacks_before = metric(stack.router, "pdserve_router_pd_fallback_total")
    pd = httpx.post(f"{stack.router}/v1/completions", json=body, timeout=120).json()
    _single(stack, "/v1/completions", body)
    single = _single(stack, "/v1/completions", body)
    assert pd["usage"]["prompt_tokens"] > 256
    assert pd["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]
    assert pd["choices"][0]["text"] == single["choices"][0]["text"]
    assert metric(stack.router, "pdserve_router_pd_fallback_total") == fallbacks_before
    # The KV really came from prefill: decode found it in shared storage.
    decode_log = (stack.data_dir / "logs" / "smollm2-1p1d" / "decode-0.log").read_text()
    assert "External Cache Hit!" in decode_log


def test_chat_pd_equals_prefix_cached_single_server(stack: Stack) -> None:
    messages = [{"role": "user", "content": LONG_PROMPT}]
    body = {"model": "smollm2", "messages": messages, "max_tokens": 24, "temperature": 0}
    fallbacks_before = metric(stack.router, "pdserve_router_pd_fallback_total")
    pd = httpx.post(f"{stack.router}/v1/chat/completions", json=body, timeout=120).json()
    _single(stack, "/v1/chat/completions", body)
    single = _single(stack, "/v1/chat/completions", body)
    assert pd["choices"][0]["message"]["content"] == single["choices"][0]["message"]["content"]
    # The router's own chat rendering matched prefill's tokens, so decode got the KV.
    assert metric(stack.router, "pdserve_router_pd_fallback_total") == fallbacks_before


def test_prompt_over_the_limit_is_refused_before_any_worker(stack: Stack) -> None:
    prefill_before = metric(stack.router, "pdserve_router_prefill_seconds_count")
    response = httpx.post(f"{stack.router}/v1/completions", timeout=30,
                          json={"model": "smollm2", "prompt": "word " * 3000, "max_tokens": 4})
    assert response.status_code == 400
    assert "2048" in response.json()["error"]["message"]
    assert metric(stack.router, "pdserve_router_prefill_seconds_count") == prefill_before


def test_unknown_model_is_404(stack: Stack) -> None:
    response = httpx.post(f"{stack.router}/v1/chat/completions", timeout=30,
                          json={"model": "nope", "messages": QUESTION})
    assert response.status_code == 404
    assert "nope" in response.json()["error"]["message"]


def test_one_token_prompts_keep_every_worker_alive(stack: Stack) -> None:
    # vLLM's ExampleConnector asks to load -128 tokens for a one-token prompt once any short
    # prompt was seen, and its engine dies; pdserve's connector subclass must prevent that.
    body = {"model": "smollm2", "prompt": "Hi", "max_tokens": 2}
    # The workers want their deployment's key (inference/worker_auth.py); the router none here.
    workers = worker_headers(stack.data_dir, "smollm2-1p1d")
    for _ in range(3):
        for url, headers in ((stack.router, {}), ("http://127.0.0.1:8100", workers),
                             ("http://127.0.0.1:8200", workers)):
            assert httpx.post(f"{url}/v1/completions", json=body, headers=headers,
                              timeout=60).status_code == 200
    body = stack.deployment()
    assert body["state"] == "ready"
    assert all(p["restarts"] == 0 for p in body["processes"])
