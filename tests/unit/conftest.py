"""Fixtures for the router's unit tests: a tiny local tokenizer, stub backends, a router factory.

Everything here runs in-process on loopback and downloads nothing. The stubs emulate the parts
of vLLM's OpenAI-compatible server that the router depends on (``/health``, the two inference
endpoints, ``return_token_ids`` and NixlConnector's ``kv_transfer_params``) and record every
inference request so tests can assert exactly what the router sent, or that it sent nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as redis  # the tests' own view of Redis, independent of the router's client
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from inference.router.config import RouterConfig
from inference.router.keys import new_key, public_prefix
from inference.router.prompts import PromptChecker
from inference.router.server import Router
from tests.unit.gateway_stubs import make_router, start_gateway  # noqa: F401 - the gateway tests' fixtures

MODEL = "tiny-test-model"
# Short enough that readiness is reached in well under a second, long enough not to spin.
HEALTH_INTERVAL_S = 0.1

# ChatML-like, with spaces as separators because the test tokenizer splits on whitespace.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
CORPUS = [
    "hello world the quick brown fox jumps over the lazy dog",
    "system user assistant you are a helpful model",
    "tell me a story about prefill and decode workers",
]

# What vLLM's NixlConnector puts on a prefill response when asked to keep KV for remote decode.
STUB_NIXL_RESPONSE_PARAMS: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [3, 4, 5],
    "remote_engine_id": "stub-prefill-engine",
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
    "tp_size": 1,
}


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer trained on a few sentences, saved like a model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def make_checker(tokenizer_dir: Path) -> Callable[..., PromptChecker]:
    cache: dict[int, PromptChecker] = {}

    def make(max_model_len: int = 64) -> PromptChecker:
        if max_model_len not in cache:
            cache[max_model_len] = PromptChecker(str(tokenizer_dir), MODEL, max_model_len)
        return cache[max_model_len]

    return make


@dataclass
class RecordedRequest:
    path: str
    body: dict[str, Any]
    headers: Mapping[str, str]


@dataclass
class StubVLLM:
    """A stub emulating vLLM's OpenAI server closely enough for the router's hand-off logic.

    Knobs are plain attributes so each test states the one behaviour it needs.
    """

    name: str
    tokenizer: Any
    requests: list[RecordedRequest] = field(default_factory=list)
    # Respond to every inference request with this (status, JSON body), like vLLM's 400s.
    fail_with: tuple[int, dict[str, Any]] | None = None
    # Report these prompt token ids instead of the stub's own tokenization.
    prompt_token_ids_override: list[int] | None = None
    # Emulate a worker that ignores return_token_ids / runs without NixlConnector.
    omit_prompt_token_ids: bool = False
    omit_kv_transfer_params: bool = False
    stream_chunks: int = 4
    # Close the connection after this many SSE chunks, without the chunked terminator.
    die_after_chunks: int | None = None
    # For a non-streamed answer: promise a longer body than is sent, then close.
    truncate_json_body: bool = False
    # Stream like a greedy model: max_tokens tokens, each a function of every token before it
    # (prompt and answer), so that any stub continues any other's answer exactly as it would
    # have gone on; a chat stream opens with vLLM's role event.
    generative: bool = False
    # When set, streaming pauses after the first chunk until the test releases it.
    stream_gate: asyncio.Event | None = None
    # End streams with vLLM's error event before [DONE], as vLLM fails a request that has
    # begun streaming.
    error_event: bool = False
    # Put vLLM's usage (prompt and completion tokens) in non-streamed answers, and in streamed
    # ones that ask for it (stream_options.include_usage).
    with_usage: bool = False
    # A non-streamed answer takes this long per prompt token, like a prefill.
    seconds_per_prompt_token: float = 0.0
    # Inference requests being answered now, and the most at once.
    active: int = 0
    most_active: int = 0
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._inference)
        app.router.add_post("/v1/completions", self._inference)
        app.router.add_post("/tokenize", self._tokenize)
        return app

    async def start(self) -> None:
        self.server = TestServer(self.app())
        await self.server.start_server()

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    def _prompt_ids(self, endpoint: str, body: dict[str, Any]) -> list[int]:
        if self.prompt_token_ids_override is not None:
            return list(self.prompt_token_ids_override)
        if endpoint == "chat":
            # vLLM's "string" content format: text parts joined by newlines (an image part
            # is left out: the stub has no image tokens).
            messages = [{**m, "content": "\n".join(p["text"] for p in m["content"]
                                                   if p.get("type", "text") == "text")}
                        if isinstance(m.get("content"), list) else m for m in body["messages"]]
            return list(self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        prompt = body["prompt"]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch: the stub answers for its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        text = prompt[0] if isinstance(prompt, list) else prompt
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def sse_chunks(self, endpoint: str, body: dict[str, Any] | None = None,
                   prompt_ids: list[int] | None = None) -> list[bytes]:
        """The exact bytes this stub streams, so tests can compare byte for byte. With
        ``return_token_ids`` in ``body``, each choice carries its token ids (and the first
        event the prompt's), as vLLM's do."""
        body = body or {}
        with_ids = bool(body.get("return_token_ids"))
        if self.generative:
            return self._generated_chunks(endpoint, body, prompt_ids or [])
        chunks = []
        for i in range(self.stream_chunks):
            if endpoint == "chat":
                choice: dict[str, Any] = {"index": 0, "delta": {"content": f"{self.name}-{i} "}}
            else:
                choice = {"index": 0, "text": f"{self.name}-{i} "}
            if with_ids:
                choice["token_ids"] = [100 + i]
            event = {"id": f"{self.name}-stream", "object": "chunk", "choices": [choice]}
            if with_ids and i == 0:
                if endpoint == "chat":
                    event["prompt_token_ids"] = prompt_ids
                else:
                    choice["prompt_token_ids"] = prompt_ids
            chunks.append(f"data: {compact(event)}\n\n".encode())
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    def _generated_chunks(self, endpoint: str, body: dict[str, Any],
                          prompt_ids: list[int]) -> list[bytes]:
        with_ids = bool(body.get("return_token_ids"))
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 8
        sequence = list(prompt_ids)
        chunks = []
        head = {"id": f"{self.name}-{len(self.requests)}", "created": 1000 + len(self.requests),
                "model": body.get("model", "stub")}
        if endpoint == "chat":
            event: dict[str, Any] = {**head, "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None}]}
            if with_ids:
                event["prompt_token_ids"] = prompt_ids
            chunks.append(f"data: {compact(event)}\n\n".encode())
        for i in range(limit):
            token = next_token(sequence)
            sequence.append(token)
            finish = "length" if i == limit - 1 else None
            if endpoint == "chat":
                choice: dict[str, Any] = {"index": 0, "delta": {"content": f"w{token} "},
                                          "logprobs": None, "finish_reason": finish}
                event = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            else:
                choice = {"index": 0, "text": f"w{token} ", "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}
                if with_ids and i == 0:
                    choice["prompt_token_ids"] = prompt_ids
                event = {**head, "object": "text_completion", "choices": [choice]}
            if with_ids:
                choice["token_ids"] = [token]
            chunks.append(f"data: {compact(event)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": limit,
                     "total_tokens": len(prompt_ids) + limit}
            event = {**head, "object": "chat.completion.chunk" if endpoint == "chat"
                     else "text_completion", "choices": [], "usage": usage}
            chunks.append(f"data: {compact(event)}\n\n".encode())
        chunks.append(b"data: [DONE]\n\n")
        return chunks

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(RecordedRequest(request.path, body, request.headers.copy()))
        try:
            tokens = self._prompt_ids("chat" if "messages" in body else "completions", body)
        except Exception as exc:  # noqa: BLE001 - vLLM refuses what it cannot render with a 400
            return web.json_response(vllm_400(f"cannot render: {exc}"), status=400)
        return web.json_response({"count": len(tokens), "max_model_len": 64, "tokens": tokens})

    async def _inference(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._serve(request)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # What vLLM's request validation does with a body it cannot read.
            return web.json_response(vllm_400(f"invalid request: {exc!r}"), status=400)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        # Keep the case-insensitive mapping: HTTP header names have no canonical case.
        self.requests.append(RecordedRequest(request.path, body, request.headers.copy()))
        if self.fail_with is not None:
            status, error = self.fail_with
            return web.json_response(error, status=status)
        endpoint = "chat" if request.path.endswith("/chat/completions") else "completions"
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if body.get("stream"):
                return await self._stream(request, endpoint, body)
            prompt_ids = self._prompt_ids(endpoint, body)
            if self.seconds_per_prompt_token:
                await asyncio.sleep(self.seconds_per_prompt_token * len(prompt_ids))
            return await self._answer(request, endpoint, body, prompt_ids)
        finally:
            self.active -= 1

    async def _answer(self, request: web.Request, endpoint: str, body: dict[str, Any],
                      prompt_ids: list[int]) -> web.StreamResponse:
        if endpoint == "chat":
            answer: dict[str, Any] = {
                "id": f"{self.name}-chat", "object": "chat.completion", "model": body.get("model", "stub"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.name},
                             "finish_reason": "length"}],
            }
            if body.get("return_token_ids") and not self.omit_prompt_token_ids:
                answer["prompt_token_ids"] = prompt_ids
        else:
            choice: dict[str, Any] = {"index": 0, "text": self.name, "finish_reason": "length"}
            if body.get("return_token_ids") and not self.omit_prompt_token_ids:
                choice["prompt_token_ids"] = prompt_ids
            answer = {"id": f"{self.name}-cmpl", "object": "text_completion",
                      "model": body.get("model", "stub"), "choices": [choice]}
        if self.with_usage:
            answer["usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": 1,
                               "total_tokens": len(prompt_ids) + 1}
        wants_kv = (body.get("kv_transfer_params") or {}).get("do_remote_decode")
        if wants_kv and not self.omit_kv_transfer_params:
            answer["kv_transfer_params"] = dict(STUB_NIXL_RESPONSE_PARAMS)
        if self.truncate_json_body:
            payload = json.dumps(answer).encode()
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.content_length = len(payload) + 100
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
            assert request.transport is not None
            request.transport.close()
            return response
        return web.json_response(answer)

    async def _stream(self, request: web.Request, endpoint: str,
                      body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = self.sse_chunks(endpoint, body, self._prompt_ids(endpoint, body))
        if self.generative:
            pass
        elif self.with_usage and (body.get("stream_options") or {}).get("include_usage"):
            # vLLM's last event before [DONE] when the client asks for usage: no choices.
            prompt_tokens = len(self._prompt_ids(endpoint, body))
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": self.stream_chunks,
                     "total_tokens": prompt_tokens + self.stream_chunks}
            event = {"id": f"{self.name}-stream", "object": "chunk", "choices": [], "usage": usage}
            chunks.insert(-1, f"data: {json.dumps(event)}\n\n".encode())
        if self.error_event:
            error = {"error": {"message": "engine failed", "type": "InternalServerError",
                               "code": 500}}
            chunks.insert(-1, f"data: {json.dumps(error)}\n\n".encode())
        for i, chunk in enumerate(chunks):
            if self.die_after_chunks is not None and i == self.die_after_chunks:
                # close() flushes what was written, then drops the connection; aiohttp then
                # cannot send the final zero-length chunk, exactly like a crashed worker.
                assert request.transport is not None
                request.transport.close()
                return response
            await response.write(chunk)
            if i == 0 and self.stream_gate is not None:
                await self.stream_gate.wait()
        await response.write_eof()
        return response


@pytest_asyncio.fixture(loop_scope="function")
async def make_stub(make_checker: Callable[..., PromptChecker]) -> AsyncIterator[
        Callable[[str], Awaitable[StubVLLM]]]:
    stubs: list[StubVLLM] = []

    async def make(name: str) -> StubVLLM:
        stub = StubVLLM(name=name, tokenizer=make_checker().tokenizer)
        await stub.start()
        stubs.append(stub)
        return stub

    yield make
    for stub in stubs:
        await stub.close()


@pytest.fixture
def dead_url() -> Iterator[str]:
    """A loopback URL on which nothing listens: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def as_client_sent(body: dict[str, Any]) -> dict[str, Any]:
    """A worker's request body without the answer's token ids, which the router asks for on
    every stream it can continue on another worker (forward.py)."""
    return {k: v for k, v in body.items() if k != "return_token_ids"}


def compact(event: dict[str, Any]) -> str:
    """JSON as vLLM writes it (pydantic): no spaces."""
    return json.dumps(event, separators=(",", ":"))


def next_token(sequence: list[int]) -> int:
    """The stub model's greedy choice after ``sequence``."""
    return 3 + (sum(sequence) * 7 + len(sequence) * 13) % 40


def vllm_400(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


@dataclass
class RunningRouter:
    router: Router
    client: TestClient

    async def metric(self, name: str, labels: dict[str, str]) -> float:
        """Read a sample from the router's /metrics page, the way Prometheus would see it.
        Without a ``revision`` in ``labels``, the samples of every revision group add up (as
        ``sum without (revision)`` would): a single-group router's test need not name it."""
        response = await self.client.get("/metrics")
        assert response.status == 200
        text = await response.text()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen = sample.labels if "revision" in labels else {
                    k: v for k, v in sample.labels.items() if k != "revision"}
                if sample.name == name and seen == labels:
                    total += sample.value
        return total


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s}s")
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture(loop_scope="function")
async def start_router(make_checker: Callable[..., PromptChecker], tokenizer_dir: Path) -> AsyncIterator[
        Callable[..., Awaitable[RunningRouter]]]:
    running: list[TestClient] = []

    async def start(*, prefill: tuple[str, ...] = (), decode: tuple[str, ...] = (),
                    colocated: tuple[str, ...] = (), wait_ready: bool = True,
                    max_model_len: int = 64, **overrides: Any) -> RunningRouter:
        settings: dict[str, Any] = {
            "served_model_name": MODEL,
            "tokenizer_path": str(tokenizer_dir),
            "max_model_len": max_model_len,
            "prefill_urls": prefill,
            "decode_urls": decode,
            "colocated_urls": colocated,
            "health_interval_s": HEALTH_INTERVAL_S,
            "connect_timeout_s": 1.0,
            "request_timeout_s": 10.0,
        }
        settings.update(overrides)
        config = RouterConfig(**settings)
        config.validate()
        router = Router(config, make_checker(max_model_len))
        client = TestClient(TestServer(router.app()))
        await client.start_server()
        running.append(client)
        if wait_ready:
            await wait_until(lambda: all(pool.ready() for pool in router.registry.primary.pools.values()))
        return RunningRouter(router, client)

    yield start
    for client in running:
        await client.close()


REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["memory", "redis"])
def redis_url(request: pytest.FixtureRequest) -> str | None:
    """The limit store of a rate-limit or budget test: the router's own memory, or Redis."""
    return REDIS_URL if request.param == "redis" else None


@pytest_asyncio.fixture(loop_scope="function")
async def fresh_key() -> AsyncIterator[str]:
    """A key whose counters start empty; its Redis counters are deleted afterwards."""
    key = new_key()
    yield key
    client = redis.Redis.from_url(REDIS_URL)
    names = [name async for name in client.scan_iter(f"pdserve:rl:{{{public_prefix(key)}}}*")]
    if names:
        await client.delete(*names)
    await client.aclose()
