"""Limits before work: a key's request rate and concurrency are checked before its body is read
or tokenized; a long prompt is tokenized off the event loop (a bounded number at a time), so
/health answers meanwhile; /tokenize and /detokenize pass the same key check and limits; the
generated-token reservation counts every answer a request asks for (n, best_of, a batch)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from inference.router.config import RouterConfig
from inference.router.keys import Limits, key_hash, new_key, public_prefix
from inference.router.prompts import PromptChecker
from inference.router.ratelimit import reservation
from inference.router.server import Router
from tests.unit.conftest import MODEL, StubVLLM, wait_until

MakeStub = Callable[[str], Awaitable[StubVLLM]]

# A 4 MB prompt of words the test tokenizer knows: ~670,000 tokens, far over any context.
LONG_PROMPT = "hello world the " * 250_000
# How long a held tokenization waits for the test before going on by itself: long enough to
# tell "released by the test" from "gave up", short enough not to hang a failing test.
HOLD_S = 5.0


class HeldChecker(PromptChecker):
    """The real checker, counting its tokenizations; while ``hold`` is clear, a long prompt's
    tokenization waits for the test (at most HOLD_S) before it runs."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.encoded = 0
        self.at_once = 0
        self.most_at_once = 0
        self.entered = threading.Event()
        self.hold = threading.Event()
        self.hold.set()
        self.released_by_test: list[bool] = []
        encode = self.encode

        def counting(text: str, add_special_tokens: bool) -> list[int]:
            self.encoded += 1
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
            try:
                if len(text) > 100_000:
                    self.entered.set()
                    self.released_by_test.append(self.hold.wait(HOLD_S))
                return encode(text, add_special_tokens)
            finally:
                self.at_once -= 1

        self.encode = counting


@dataclass
class Started:
    client: TestClient
    checker: HeldChecker
    router: Router

    async def post(self, path: str, body: dict[str, Any], key: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return await self.client.post(path, json=body, headers=headers)


StartHeld = Callable[..., Awaitable[Started]]


@pytest_asyncio.fixture(loop_scope="function")
async def held_router(tokenizer_dir: Path, tmp_path: Path,
                      make_stub: MakeStub) -> AsyncIterator[StartHeld]:
    # Asks for make_stub so that its teardown (below) runs first: a stub closes only once its
    # held streams have ended.
    clients: list[TestClient] = []
    checkers: list[HeldChecker] = []
    workers: list[StubVLLM] = []

    async def start(worker: StubVLLM, key: str | None = None, limits: dict[str, int] | None = None,
                    **settings: Any) -> Started:
        workers.append(worker)
        if key is not None:
            path = tmp_path / f"keys-{len(clients)}.json"
            path.write_text(json.dumps({"version": "1", "require_key": True, "keys": [
                {"id": 1, "prefix": public_prefix(key), "hash": key_hash(key),
                 "limits": limits or {}}]}))
            settings["keys_file"] = str(path)
        config = RouterConfig(served_model_name=MODEL, tokenizer_path=str(tokenizer_dir),
                              max_model_len=64, health_interval_s=0.1,
                              colocated_urls=(worker.url,), **settings)
        config.validate()
        checker = HeldChecker(str(tokenizer_dir), MODEL, 64)
        checkers.append(checker)
        router = Router(config, checker)
        client = TestClient(TestServer(router.app()))
        await client.start_server()
        clients.append(client)
        await wait_until(lambda: all(pool.ready() for pool in router.registry.primary.pools.values()))
        return Started(client, checker, router)

    yield start
    for checker in checkers:
        checker.hold.set()  # never leave a thread waiting
    for worker in workers:
        if worker.stream_gate is not None:
            worker.stream_gate.set()  # nor a stream, should the test have failed while one was held
    for client in clients:
        await client.close()


def completion(prompt: str = "hello world", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4, **fields}


async def refused(response: Any, limit: str) -> None:
    assert response.status == 429, await response.text()
    assert int(response.headers["Retry-After"]) >= 1
    error = (await response.json())["error"]
    assert (error["code"], error["param"]) == ("rate_limit_exceeded", limit)


async def test_a_key_over_its_request_rate_is_refused_before_its_prompt_is_tokenized(
        held_router: StartHeld, make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    key = new_key()
    started = await held_router(worker, key, {"requests_per_minute": 1})
    assert (await started.post("/v1/completions", completion(), key)).status == 200
    before = started.checker.encoded
    for _ in range(3):
        await refused(await started.post("/v1/completions", completion(LONG_PROMPT), key),
                      "requests_per_minute")
    assert started.checker.encoded == before  # never tokenized
    assert len(worker.requests) == 1


async def test_a_key_at_its_concurrency_is_refused_before_its_prompt_is_tokenized(
        held_router: StartHeld, make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    key = new_key()
    started = await held_router(worker, key, {"max_concurrency": 1})
    worker.stream_gate = asyncio.Event()
    held = await started.post("/v1/completions", completion(stream=True), key)
    await held.content.readline()
    before = started.checker.encoded
    await refused(await started.post("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}]}, key),
        "max_concurrency")
    assert started.checker.encoded == before
    worker.stream_gate.set()
    await held.read()


async def test_health_answers_while_long_prompts_are_tokenized(held_router: StartHeld,
                                                               make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    started = await held_router(worker, tokenize_threads=1)
    started.checker.hold.clear()
    floods = [asyncio.create_task(started.post("/v1/completions", completion(LONG_PROMPT)))
              for _ in range(3)]
    await wait_until(started.checker.entered.is_set, timeout_s=3 * HOLD_S)
    # The first prompt is being tokenized (held in its thread): the loop still answers.
    health = await started.client.get("/health")
    assert health.status == 200
    assert (await health.json())["status"] == "ok"
    assert started.checker.at_once == 1
    started.checker.hold.set()
    answers = await asyncio.gather(*floods)
    # Tokenized, found too long, refused before any worker: one prompt at a time (one thread).
    for answer in answers:
        assert answer.status == 400
        assert (await answer.json())["error"]["code"] == "context_length_exceeded"
    assert started.checker.released_by_test[0] is True  # health came while it was held
    assert started.checker.most_at_once == 1
    assert worker.requests == []


async def test_past_the_tokenizing_queue_a_request_is_503_at_once(held_router: StartHeld,
                                                                  make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    started = await held_router(worker, tokenize_threads=1, tokenize_queue=1)
    started.checker.hold.clear()
    first = asyncio.create_task(started.post("/v1/completions", completion(LONG_PROMPT)))
    await wait_until(started.checker.entered.is_set, timeout_s=3 * HOLD_S)
    second = asyncio.create_task(started.post("/v1/completions", completion(LONG_PROMPT)))
    await wait_until(lambda: started.router.tokenizing.waiting == 1)
    busy = await started.post("/v1/completions", completion(LONG_PROMPT))
    assert busy.status == 503
    assert busy.headers["Retry-After"] == "1"
    assert (await busy.json())["error"]["code"] == "tokenizer_busy"
    # A short prompt is tokenized on the loop and never waits for a thread.
    assert (await started.post("/v1/completions", completion())).status == 200
    started.checker.hold.set()
    assert [(await first).status, (await second).status] == [400, 400]


async def test_tokenize_and_detokenize_need_a_key_and_count_against_its_limits(
        held_router: StartHeld, make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    key = new_key()
    started = await held_router(worker, key, {"requests_per_minute": 2})
    body = {"model": MODEL, "prompt": "hello world"}
    for path in ("/tokenize", "/detokenize"):
        response = await started.post(path, body)
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert (await started.post("/tokenize", body, key)).status == 200
    # The stub has no /detokenize: its 404 is relayed, and the request counted all the same.
    assert (await started.post("/detokenize", {"model": MODEL, "tokens": [1, 2]}, key)).status == 404
    await refused(await started.post("/tokenize", body, key), "requests_per_minute")
    await refused(await started.post("/v1/completions", completion(), key), "requests_per_minute")
    assert [r.path for r in worker.requests] == ["/tokenize"]


async def test_tokenize_holds_a_concurrency_slot(held_router: StartHeld,
                                                 make_stub: MakeStub) -> None:
    worker = await make_stub("w")
    key = new_key()
    started = await held_router(worker, key, {"max_concurrency": 1})
    worker.stream_gate = asyncio.Event()
    held = await started.post("/v1/completions", completion(stream=True), key)
    await held.content.readline()
    await refused(await started.post("/tokenize", {"model": MODEL, "prompt": "hello"}, key),
                  "max_concurrency")
    worker.stream_gate.set()
    await held.read()
    assert (await started.post("/tokenize", {"model": MODEL, "prompt": "hello"}, key)).status == 200


@pytest.mark.parametrize("fields", [{"n": 3}, {"best_of": 3}, {"prompt": ["hello", "world", "the"]}])
async def test_the_generated_token_reservation_counts_every_answer_asked_for(
        held_router: StartHeld, make_stub: MakeStub, fields: dict[str, Any]) -> None:
    worker = await make_stub("w")
    key = new_key()
    started = await held_router(worker, key, {"generated_tokens_per_minute": 20})
    worker.stream_gate = asyncio.Event()
    # Three answers of up to 4 tokens each: 12 of the minute's 20 are reserved while it runs.
    held = await started.post("/v1/completions", completion(stream=True, **fields), key)
    assert held.status == 200
    await held.content.readline()
    await refused(await started.post("/v1/completions", completion(**fields), key),
                  "generated_tokens_per_minute")
    assert (await started.post("/v1/completions", completion(max_tokens=8), key)).status == 200
    worker.stream_gate.set()
    await held.read()


def test_the_reservation_is_max_tokens_times_the_answers_never_over_the_limit(
        tokenizer_dir: Path) -> None:
    limits = Limits(generated_tokens_per_minute=100)
    assert reservation(limits, 8, 3) == 24
    assert reservation(limits, None, 1) == 100  # the default 256, capped at the limit
    assert reservation(limits, 50, 4) == 100
    assert reservation(Limits(), 8, 3) == 0
    checker = PromptChecker(str(tokenizer_dir), MODEL, 64)
    sequences = {json.dumps(body): checker.parse(endpoint, {"model": MODEL, **body}).sequences
                 for endpoint, body in [
                     ("completions", {"prompt": "hello", "n": 2, "best_of": 5}),
                     ("completions", {"prompt": ["hello", "world"], "n": 2}),
                     ("completions", {"prompt": [[1, 2], [3]], "best_of": 3}),
                     ("completions", {"prompt": [1, 2, 3], "n": True}),
                     ("chat", {"messages": [{"role": "user", "content": "hi"}], "n": 4})]}
    assert list(sequences.values()) == [5, 4, 6, 1, 4]
