"""The router tokenizes a prompt only when something needs its token ids.

With a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM) a prompt has at most as many
tokens as UTF-8 bytes, so a prompt that fits even at one token per byte is not tokenized for
the length check; the PD hand-off and prefix_aware still get exact ids. A key's prompt-token
limit charges an estimate and settles on the exact count that vLLM's usage brings (in a
non-streamed answer, or a stream's usage event), or that the router counts after a streamed
answer's last chunk; only an exact count refuses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from inference.router.config import RouterConfig
from inference.router.keys import key_hash, new_key, public_prefix
from inference.router.prompts import PromptChecker, _token_bound
from inference.router.server import Router
from tests.unit.conftest import CHAT_TEMPLATE, CORPUS, MODEL, StubVLLM, wait_until

MakeStub = Callable[[str], Awaitable[StubVLLM]]

SAMPLES = ["hello world", " leading space", "Ünïcödé – 字 🙂 mixed", "<|im_start|> user hi <|im_end|>",
           "tabs\tand\nnewlines\n\n", "x" * 300, "🙂" * 20, ""]


@pytest.fixture(scope="session")
def byte_level_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(special_tokens=["<|im_start|>", "<|im_end|>"], vocab_size=400,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>")
    fast.chat_template = CHAT_TEMPLATE
    path = tmp_path_factory.mktemp("byte-level")
    fast.save_pretrained(path)
    return path


class CountingChecker(PromptChecker):
    """The real checker, counting how often it tokenizes."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.encoded = 0
        encode = self.encode

        def counting(text: str, add_special_tokens: bool) -> list[int]:
            self.encoded += 1
            return encode(text, add_special_tokens)

        self.encode = counting


@dataclass
class Started:
    client: TestClient
    checker: CountingChecker
    router: Router


StartByteLevel = Callable[..., Awaitable[Started]]


@pytest_asyncio.fixture(loop_scope="function")
async def byte_level_router(byte_level_dir: Path) -> AsyncIterator[StartByteLevel]:
    clients: list[TestClient] = []

    async def start(max_model_len: int = 64, **settings: Any) -> Started:
        config = RouterConfig(served_model_name=MODEL, tokenizer_path=str(byte_level_dir),
                              max_model_len=max_model_len, health_interval_s=0.1, **settings)
        config.validate()
        checker = CountingChecker(str(byte_level_dir), MODEL, max_model_len)
        router = Router(config, checker)
        client = TestClient(TestServer(router.app()))
        await client.start_server()
        clients.append(client)
        await wait_until(lambda: all(pool.ready() for pool in router.registry.primary.pools.values()))
        return Started(client, checker, router)

    yield start
    for client in clients:
        await client.close()


def test_the_byte_bound_holds_for_a_byte_level_tokenizer(byte_level_dir: Path) -> None:
    checker = PromptChecker(str(byte_level_dir), MODEL, 64)
    assert checker.bound is not None
    for text in SAMPLES:
        for add_special_tokens in (True, False):
            assert len(checker.encode(text, add_special_tokens)) <= checker.bound(text, add_special_tokens)


def test_no_bound_is_claimed_for_other_tokenizers(make_checker: Callable[..., PromptChecker]) -> None:
    # conftest's word-level tokenizer: one token may cover no bytes' worth of guarantee.
    assert _token_bound(make_checker().tokenizer) is None
    assert make_checker().bound is None


async def test_a_prompt_that_surely_fits_is_not_tokenized(
        byte_level_router: StartByteLevel,
        make_stub: MakeStub) -> None:
    worker = await make_stub("full")
    started = await byte_level_router(colocated_urls=(worker.url,))
    short = {"model": MODEL, "prompt": "hello world", "max_tokens": 8}
    assert (await started.client.post("/v1/completions", json=short)).status == 200
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    assert (await started.client.post("/v1/chat/completions", json=chat)).status == 200
    assert started.checker.encoded == 0
    assert len(worker.requests) == 2


async def test_a_prompt_the_bound_cannot_settle_is_tokenized_and_still_served(
        byte_level_router: StartByteLevel,
        make_stub: MakeStub) -> None:
    worker = await make_stub("full")
    started = await byte_level_router(colocated_urls=(worker.url,))
    # 71 bytes, more than max_model_len, but a handful of tokens: the corpus's words merge.
    fits = {"model": MODEL, "max_tokens": 4,
            "prompt": "hello world the quick brown fox jumps over the lazy dog tell me a story"}
    assert len(fits["prompt"].encode()) > 64
    response = await started.client.post("/v1/completions", json=fits)
    assert response.status == 200, await response.text()
    assert started.checker.encoded == 1


async def test_a_prompt_over_the_limit_is_still_400_before_any_worker(
        byte_level_router: StartByteLevel,
        make_stub: MakeStub) -> None:
    worker = await make_stub("full")
    started = await byte_level_router(colocated_urls=(worker.url,))
    # A letter the tokenizer never saw merged: one token per byte, 140 in all.
    too_long = {"model": MODEL, "prompt": "Ж" * 70}
    response = await started.client.post("/v1/completions", json=too_long)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "context_length_exceeded"
    assert worker.requests == []


async def test_prefix_aware_gets_the_token_ids_it_routes_by(
        byte_level_router: StartByteLevel,
        make_stub: MakeStub) -> None:
    workers = [await make_stub("full-a"), await make_stub("full-b")]
    started = await byte_level_router(
        colocated_urls=tuple(w.url for w in workers), colocated_policy="prefix_aware",
        prefix_block_size=2, prefix_blocks=1)
    for tail in ("fox", "dog", "story"):
        body = {"model": MODEL, "prompt": f"hello world tell me a {tail}", "max_tokens": 4}
        assert (await started.client.post("/v1/completions", json=body)).status == 200
    assert started.checker.encoded == 3
    assert sorted(len(w.requests) for w in workers) == [0, 3]


def keys_file(tmp_path: Path, key: str, **limits: int) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"version": "1", "require_key": True, "keys": [
        {"id": 1, "prefix": public_prefix(key), "hash": key_hash(key), "limits": limits}]}))
    return str(path)


def prompt_tokens_counted(router: Router, key: str) -> int:
    """The prompt tokens counted for ``key`` by the router's in-memory limiter (this minute's
    and, should the minute have turned meanwhile, the last one's)."""
    _minute, current, previous = router.limiter.memory.counters[(public_prefix(key), 1)]
    return current + previous


async def test_a_prompt_token_limit_charges_an_estimate_and_settles_the_exact_count(
        byte_level_router: StartByteLevel, make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("full")
    worker.with_usage = True
    key = new_key()
    started = await byte_level_router(colocated_urls=(worker.url,), max_model_len=256,
                                      keys_file=keys_file(tmp_path, key,
                                                          prompt_tokens_per_minute=10_000))
    headers = {"Authorization": f"Bearer {key}"}
    text = "hello world tell me a story about prefill and decode workers"
    body = {"model": MODEL, "prompt": text, "max_tokens": 4}

    # Non-streamed: vLLM's usage brings the exact count; the router never tokenizes.
    response = await started.client.post("/v1/completions", json=body, headers=headers)
    assert response.status == 200
    assert started.checker.encoded == 0
    from_usage = len(worker._prompt_ids("completions", body))
    assert prompt_tokens_counted(started.router, key) == from_usage

    # Streamed (no usage): counted by the router, but only after the last chunk.
    worker.stream_gate = asyncio.Event()
    streamed = await started.client.post("/v1/completions", json={**body, "stream": True},
                                         headers=headers)
    await streamed.content.readline()
    assert started.checker.encoded == 0
    worker.stream_gate.set()
    await streamed.read()
    await wait_until(lambda: started.checker.encoded == 1)
    exact = len(started.checker.tokenizer(text, add_special_tokens=True)["input_ids"])
    assert prompt_tokens_counted(started.router, key) == from_usage + exact

    # Streamed with the usage event the client asked for: the router reads it, not tokenizes.
    asked = {**body, "stream": True, "stream_options": {"include_usage": True}}
    response = await started.client.post("/v1/completions", json=asked, headers=headers)
    assert response.status == 200
    assert b'"usage"' in await response.read()  # relayed to the client as it came
    assert started.checker.encoded == 1
    assert prompt_tokens_counted(started.router, key) == 2 * from_usage + exact


async def test_only_an_exact_count_refuses_a_prompt(byte_level_router: StartByteLevel,
                                                    make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("full")
    key = new_key()
    text = "hello world the quick brown fox jumps over the lazy dog"
    started = await byte_level_router(colocated_urls=(worker.url,), max_model_len=256,
                                      keys_file=keys_file(tmp_path, key,
                                                          prompt_tokens_per_minute=12))
    exact = len(started.checker.tokenizer(text, add_special_tokens=True)["input_ids"])
    # The corpus's words merge: fewer tokens than the estimate at four characters a token.
    assert exact <= 12 < started.router.admission.chars_per_token.estimate(text)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "prompt": text, "max_tokens": 4}
    response = await started.client.post("/v1/completions", json=body, headers=headers)
    assert response.status == 200, await response.text()
    assert started.checker.encoded == 1  # the estimate refused; the exact count admitted
    assert prompt_tokens_counted(started.router, key) == exact
    # The minute's budget is spent now, exactly: the same prompt is refused, naming the limit.
    response = await started.client.post("/v1/completions", json=body, headers=headers)
    assert response.status == 429
    assert (await response.json())["error"]["param"] == "prompt_tokens_per_minute"
