"""Per-key rate limits split by phase, in memory and on the real Redis at 127.0.0.1:6379: 429 with
Retry-After naming the limit, limits shared by two routers on one Redis, the generated-token
reservation given back, concurrency released on every exit, and Redis failing mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from inference.router.keys import LIMIT_NAMES, key_hash, public_prefix
from inference.router.ratelimit_stores import REDIS_TIMEOUT_S, MemoryStore, wait_seconds
from inference.router.redis_client import RedisReplyError, encode, parse, parse_url
from tests.unit.conftest import MODEL, REDIS_URL, RunningRouter, StubVLLM

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

PROMPT = "hello world the quick brown fox"  # 6 tokens with the test tokenizer
RATE_LIMITED = "pdserve_router_rate_limited_total"


def completion(max_tokens: int = 4, stream: bool = False, prompt: str = PROMPT) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def limited_router(start_router: StartRouter, worker: StubVLLM, tmp_path: Path, key: str,
                         redis_url: str | None, **settings: Any) -> RunningRouter:
    """A router whose one key has the limits among ``settings``; the rest configure the router."""
    limits = {name: settings.pop(name) for name in LIMIT_NAMES if name in settings}
    path = tmp_path / f"keys-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"version": "1", "require_key": True, "keys": [
        {"id": 1, "prefix": public_prefix(key), "hash": key_hash(key), "limits": limits}]}))
    return await start_router(colocated=(worker.url,), keys_file=str(path), redis_url=redis_url,
                              **settings)


async def post(running: RunningRouter, key: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    response = await running.client.post("/v1/completions", json=body,
                                         headers={"Authorization": f"Bearer {key}"})
    return response.status, response.headers, await response.read()


def refused_by(status: int, headers: Any, payload: bytes) -> str:
    assert status == 429, payload
    # At most two minutes: a full minute weighs on the sliding window through the next one.
    assert 1 <= int(headers["Retry-After"]) <= 120
    error = json.loads(payload)["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["param"] in error["message"]
    return str(error["param"])


async def test_requests_per_minute(start_router: StartRouter, make_stub: MakeStub, tmp_path: Path,
                                   redis_url: str | None, fresh_key: str) -> None:
    running = await limited_router(start_router, await make_stub("w"), tmp_path, fresh_key,
                                   redis_url, requests_per_minute=2)
    assert [(await post(running, fresh_key, completion()))[0] for _ in range(2)] == [200, 200]
    assert refused_by(*await post(running, fresh_key, completion())) == "requests_per_minute"
    assert await running.metric(RATE_LIMITED, {"limit": "requests_per_minute"}) == 1


async def test_two_routers_share_limits_through_redis(start_router: StartRouter, make_stub: MakeStub,
                                                      tmp_path: Path, fresh_key: str) -> None:
    worker = await make_stub("w")
    first = await limited_router(start_router, worker, tmp_path, fresh_key, REDIS_URL,
                                 requests_per_minute=3)
    second = await limited_router(start_router, worker, tmp_path, fresh_key, REDIS_URL,
                                  requests_per_minute=3)
    assert (await post(first, fresh_key, completion()))[0] == 200
    assert (await post(second, fresh_key, completion()))[0] == 200
    assert (await post(first, fresh_key, completion()))[0] == 200
    # Each router alone has seen fewer than 3; together they have used the key's minute.
    assert refused_by(*await post(second, fresh_key, completion())) == "requests_per_minute"
    assert refused_by(*await post(first, fresh_key, completion())) == "requests_per_minute"


async def test_prompt_tokens_per_minute(start_router: StartRouter, make_stub: MakeStub,
                                        tmp_path: Path, redis_url: str | None, fresh_key: str) -> None:
    running = await limited_router(start_router, await make_stub("w"), tmp_path, fresh_key,
                                   redis_url, prompt_tokens_per_minute=10)
    assert (await post(running, fresh_key, completion()))[0] == 200  # 6 of 10
    assert refused_by(*await post(running, fresh_key, completion())) == "prompt_tokens_per_minute"
    assert (await post(running, fresh_key, completion(prompt="hello world")))[0] == 200  # 8 of 10
    # A prompt larger than the whole minute's budget can never pass: the message says so.
    status, headers, payload = await post(running, fresh_key, completion(prompt=" ".join(["the"] * 11)))
    assert refused_by(status, headers, payload) == "prompt_tokens_per_minute"
    assert "needs 11" in json.loads(payload)["error"]["message"]


async def test_generated_tokens_are_reserved_then_reconciled(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, redis_url: str | None,
        fresh_key: str) -> None:
    worker = await make_stub("w")
    running = await limited_router(start_router, worker, tmp_path, fresh_key, redis_url,
                                   generated_tokens_per_minute=10)
    # The stub's non-streamed answers carry no usage: nothing generated, all 8 given back.
    for _ in range(3):
        assert (await post(running, fresh_key, completion(max_tokens=8)))[0] == 200
    # A streamed answer of 4 token events keeps 4 of its 8 reserved tokens.
    assert (await post(running, fresh_key, completion(max_tokens=8, stream=True)))[0] == 200
    assert refused_by(*await post(running, fresh_key, completion(max_tokens=8))) == \
        "generated_tokens_per_minute"
    assert (await post(running, fresh_key, completion(max_tokens=6)))[0] == 200

    # While a request holds its reservation, it is not available to the next one.
    worker.stream_gate = asyncio.Event()
    held = await running.client.post("/v1/completions", json=completion(max_tokens=5, stream=True),
                                     headers={"Authorization": f"Bearer {fresh_key}"})
    await held.content.readline()
    assert refused_by(*await post(running, fresh_key, completion(max_tokens=2))) == \
        "generated_tokens_per_minute"
    worker.stream_gate.set()
    await held.read()
    # The held request generated 4 of its 5: one is back.
    assert (await post(running, fresh_key, completion(max_tokens=1)))[0] == 200


async def test_concurrency_is_released_after_a_client_disconnects(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, redis_url: str | None,
        fresh_key: str) -> None:
    worker = await make_stub("w")
    running = await limited_router(start_router, worker, tmp_path, fresh_key, redis_url,
                                   max_concurrency=1)
    worker.stream_gate = asyncio.Event()
    held = await running.client.post("/v1/completions", json=completion(stream=True),
                                     headers={"Authorization": f"Bearer {fresh_key}"})
    assert held.status == 200
    await held.content.readline()
    assert refused_by(*await post(running, fresh_key, completion())) == "max_concurrency"

    held.close()  # the client goes away mid-stream
    worker.stream_gate.set()
    worker.stream_gate = None
    deadline = asyncio.get_running_loop().time() + 5
    while (status := (await post(running, fresh_key, completion()))[0]) != 200:
        assert status == 429 and asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)


async def test_concurrency_is_released_after_a_worker_error_and_a_timeout(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, redis_url: str | None,
        fresh_key: str) -> None:
    worker = await make_stub("w")
    running = await limited_router(start_router, worker, tmp_path, fresh_key, redis_url,
                                   max_concurrency=1, request_timeout_s=0.5)
    worker.fail_with = (500, {"error": {"message": "engine dead"}})
    for _ in range(3):
        assert (await post(running, fresh_key, completion()))[0] == 500
    worker.fail_with = None
    worker.stream_gate = asyncio.Event()  # never set: the stream stalls until the timeout
    for _ in range(2):
        status, _headers, payload = await post(running, fresh_key, completion(stream=True))
        assert status == 200 and b'"error"' in payload  # ended by the router's SSE error event
    worker.stream_gate = None
    assert (await post(running, fresh_key, completion()))[0] == 200


class RedisProxy:
    """A TCP relay in front of the real Redis that the test can cut, as a network failure would."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        # Set: commands are swallowed, as by a Redis that hangs or a network that drops packets.
        self.silent = False

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self.writers += [writer, upstream_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    if not self.silent:
                        sink.write(data)
                        await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def test_when_redis_fails_mid_run_limits_go_on_in_memory(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, fresh_key: str) -> None:
    proxy = RedisProxy()
    port = await proxy.start()
    running = await limited_router(start_router, await make_stub("w"), tmp_path, fresh_key,
                                   f"redis://127.0.0.1:{port}/0", requests_per_minute=3)
    assert (await post(running, fresh_key, completion()))[0] == 200  # counted in Redis
    await proxy.cut()
    # Inference goes on (fail-open for the shared count) and this router still enforces the
    # limit with its own counters (closed per replica).
    statuses = [(await post(running, fresh_key, completion()))[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert await running.metric("pdserve_router_rate_limit_store_errors_total", {}) >= 1


def test_the_wait_until_a_cost_fits() -> None:
    # 10/min, 10 used last minute and 2 this one, a quarter into this minute: 7.5 + 2 count;
    # one more fits once last minute weighs 7 or less, at 0.3 of this minute: 3 s from now.
    assert wait_seconds(10, 2, 1, 10, 0.25) == pytest.approx(3)
    # This minute is full: next minute, once this minute's 10 weigh 9 or less.
    assert wait_seconds(0, 10, 1, 10, 0.5) == pytest.approx(30 + 6)
    assert wait_seconds(0, 0, 11, 10, 0.5) == 60


async def test_the_memory_store_slides_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [600.0]
    monkeypatch.setattr("inference.router.ratelimit.time.time", lambda: clock[0])
    store = MemoryStore()
    costs = ((2, 1), (0, 0), (0, 0))
    assert (await store.admit("p", costs, 0, "", 1))[0] == 0
    assert (await store.admit("p", costs, 0, "", 1))[0] == 0
    assert (await store.admit("p", costs, 0, "", 1))[0] == 1
    clock[0] = 660.0 + 30  # half into the next minute: the 2 weigh 1
    assert (await store.admit("p", costs, 0, "", 1))[0] == 0
    assert (await store.admit("p", costs, 0, "", 1))[0] == 1
    clock[0] = 780.0  # two minutes later: all gone
    assert (await store.admit("p", costs, 0, "", 1))[0] == 0


def test_redis_replies_are_parsed_however_they_are_cut() -> None:
    wire = b"*2\r\n:0\r\n:29934\r\n$5\r\nhello\r\n-NOSCRIPT No matching script\r\n+OK\r\n$-1\r\n"
    expected = [[0, 29934], b"hello", "NOSCRIPT No matching script", "OK", None]
    for cut in range(len(wire) + 1):
        # Everything a first read of `cut` bytes allows, then the rest after a second read.
        buffer, values, pos = bytearray(wire[:cut]), [], 0
        while (item := parse(buffer, pos)) is not None:
            values.append(item[0])
            pos = item[1]
        buffer += wire[cut:]
        while (item := parse(buffer, pos)) is not None:
            values.append(item[0])
            pos = item[1]
        assert [str(v) if isinstance(v, RedisReplyError) else v for v in values] == expected
    assert encode(("EVALSHA", "abc", 1, b"k")) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$1\r\nk\r\n")


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:6379", "scheme"),
    ("unix:///run/redis.sock", "scheme"),
    ("redis://127.0.0.1:6379/zero", "database"),
])
def test_a_bad_redis_url_is_refused_at_start_naming_it(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"REDIS_URL.*{message}"):
        parse_url(url)
    assert parse_url("rediss://u:p%40ss@cache:6380/2") == {
        "host": "cache", "port": 6380, "username": "u", "password": "p@ss", "db": 2, "tls": True}


async def test_a_redis_that_stops_answering_costs_one_timeout_then_memory(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path, fresh_key: str) -> None:
    proxy = RedisProxy()
    port = await proxy.start()
    running = await limited_router(start_router, await make_stub("w"), tmp_path, fresh_key,
                                   f"redis://127.0.0.1:{port}/0", requests_per_minute=100)
    assert (await post(running, fresh_key, completion()))[0] == 200
    proxy.silent = True
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await post(running, fresh_key, completion()))[0] == 200
    assert loop.time() - started < REDIS_TIMEOUT_S + 0.5  # one timeout, then in memory
    started = loop.time()
    assert (await post(running, fresh_key, completion()))[0] == 200
    assert loop.time() - started < 0.2  # no second wait while Redis is known to be down
    await proxy.cut()
