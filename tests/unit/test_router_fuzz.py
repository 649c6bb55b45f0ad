"""The router survives fuzzing: whatever a client sends to any of its routes, with or without
the admin token, the router answers it itself with a 4xx in OpenAI's error shape (or serves
it), never with a 5xx of its own.

Hypothesis generates the requests (a fixed seed through ``derandomize``, a bounded number of
examples): raw bytes, JSON of any shape, request bodies close to valid ones with wrong types,
huge numbers, lone surrogates and deep nesting, and hand-written worst cases (4 MiB of
whitespace, invalid UTF-8, integers of 5,000 digits). Some go over a raw socket, so that header
values and paths can carry bytes that are not UTF-8. The workers behind the router answer
every call with 200, so any 5xx seen is the router's own.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.router.config import RouterConfig
from inference.router.errors import error_type
from inference.router.keys import key_hash
from inference.router.prompts import PromptChecker
from inference.router.server import Router
from tests.unit.conftest import MODEL, wait_until

ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef"
KEY = "pds_fuzz0001_" + "s" * 43
KEY_SET: dict[str, Any] = {"version": "fuzz", "require_key": False, "keys": [{
    "id": 1, "prefix": "fuzz0001", "hash": key_hash(KEY), "state": "active",
    "limits": {"requests_per_minute": 100_000, "prompt_tokens_per_minute": 10_000_000,
               "generated_tokens_per_minute": 10_000_000, "max_concurrency": 50}}]}
MAX_BODY = 4 * 1024 * 1024
EXAMPLES = 200

ROUTES = [("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"),
          ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("GET", "/admin/backends"), ("POST", "/admin/backends"), ("DELETE", "/admin/backends"),
          ("GET", "/admin/keys"), ("PUT", "/admin/keys"), ("GET", "/admin/keys/usage")]

# ---- the workers: every call answered with 200 ------------------------------------------


class Worker:
    """Answers /health and every inference call with a well-formed 200 (streamed when asked),
    whatever the body, so that a 5xx the client sees can only be the router's."""

    def __init__(self) -> None:
        self.server = TestServer(self.app())

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2 * MAX_BODY)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/completions", self.answer)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.tokenize)
        app.router.add_get("/version", self.tokenize)
        return app

    async def tokenize(self, _request: web.Request) -> web.Response:
        return web.json_response({"count": 3, "max_model_len": 64, "tokens": [1, 2, 3],
                                  "prompt": "x", "version": "0.32.0"})

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response()

    async def answer(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError):
            body = None
        stream = isinstance(body, dict) and body.get("stream") is True
        if stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n')
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response({
            "id": "fuzz", "object": "text_completion", "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "text": "x", "prompt_token_ids": [1, 2, 3],
                         "message": {"role": "assistant", "content": "x"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            "kv_transfer_params": {"remote_engine_id": "fuzz", "remote_block_ids": [1]},
        })


# ---- what is sent -----------------------------------------------------------------------

# Any text, and text with lone surrogates (json.dumps escapes them as \udXXX, which json.loads
# accepts and a tokenizer refuses).
TEXT = st.one_of(st.text(max_size=24), st.text(alphabet=st.one_of(
    st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)), max_size=24))
NUMBERS = st.one_of(st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
                    st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# Hand-written worst cases, as bytes.
NASTY: list[bytes] = [
    b"", b"{", b"}", b"[", b"null", b"true", b"0", b"[]", b'""', b"NaN", b"-Infinity",
    b"\xff\xfe\xfd", b"\xc3\x28", b'{"model": "\xff"}', b"\x00" * 64,
    b" " * MAX_BODY, b" " * (MAX_BODY + 1), b"\n\t " * 1000,
    b"9" * 5000, b'{"model": "%s", "max_tokens": %s}' % (MODEL.encode(), b"9" * 5000),
    b'{"model": "%s", "prompt": [%s]}' % (MODEL.encode(), b"1" * 5000),
    b'{"model": "%s", "prompt": "\\ud800"}' % MODEL.encode(),
    b'{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}' % MODEL.encode(),
    *(nested(depth).encode() for depth in (100, 900, 990, 5_000, 100_000)),
    *(b'{"model": "%s", "prompt": "hello", "user": %s}' % (MODEL.encode(), nested(depth).encode())
      # Around the depth where parsing still works but serializing again for the workers,
      # deeper in the stack, would not.
      for depth in (65, 500, *range(850, 1000, 10), 2_000)),
    *(b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "x": %s}'
      % (MODEL.encode(), nested(depth, "{}").encode()) for depth in range(850, 1000, 15)),
    b'{"role": "prefill", "url": "http://127.0.0.1:1"}',
    b'{"version": "v", "keys": [{"id": 1, "prefix": "abcdefgh", "hash": "%s"}]}' % (b"a" * 64),
]

MESSAGE = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), JSON)},
    optional={"content": st.one_of(TEXT, JSON, st.lists(st.fixed_dictionaries(
        {"type": st.just("text"), "text": TEXT}), max_size=2)), "name": JSON})
# Mostly the served model, so that the rest of the body gets looked at.
MODEL_FIELD = st.one_of(st.just(MODEL), st.just(MODEL), st.just(MODEL), JSON)
OPTIONAL = {
    "stream": st.one_of(st.booleans(), JSON),
    "max_tokens": st.one_of(NUMBERS, JSON), "max_completion_tokens": st.one_of(NUMBERS, JSON),
    "n": st.one_of(st.integers(-2, 3), JSON), "best_of": st.one_of(st.integers(-2, 3), JSON),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": JSON}), JSON),
    "kv_transfer_params": JSON, "return_token_ids": JSON, "temperature": NUMBERS,
    "min_tokens": JSON, "user": JSON,
}
CHAT_BODY = st.fixed_dictionaries(
    {"model": MODEL_FIELD,
     "messages": st.one_of(st.lists(st.one_of(MESSAGE, MESSAGE, JSON), min_size=1, max_size=3), JSON)},
    optional={**OPTIONAL, "add_generation_prompt": JSON, "continue_final_message": JSON,
              "chat_template_kwargs": st.one_of(st.dictionaries(TEXT, JSON, max_size=2), JSON)})
COMPLETION_BODY = st.fixed_dictionaries(
    {"model": MODEL_FIELD,
     "prompt": st.one_of(TEXT, st.lists(NUMBERS, max_size=6), st.lists(TEXT, max_size=2), JSON)},
    optional=OPTIONAL)
BACKEND = st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(["prefill", "decode", "colocated"]), JSON),
    "url": st.one_of(st.sampled_from([
        "http://127.0.0.1:1", "http://127.0.0.1:2/", "http://[::1]:3", "https://127.0.0.1:4",
        "ftp://127.0.0.1:5", "http://127.0.0.1:99999", "http://u:p@127.0.0.1:6", "http://127.0.0.1:7/v1",
        "http://127.0.0.1:8?x=1", "http://\u00e9\u0301.invalid:9", "http://[::1", "http://127.0.0.1"]),
        TEXT, JSON)})
LIMITS = st.dictionaries(st.sampled_from(["requests_per_minute", "prompt_tokens_per_minute",
                                          "generated_tokens_per_minute", "max_concurrency", "x"]),
                         st.one_of(st.integers(-1, 10**30), JSON), max_size=4)
KEY_ENTRY = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.integers(), TEXT, JSON),
    "prefix": st.one_of(st.sampled_from(["abcdefgh", "fuzz0001", "abc_efgh", "ab"]), TEXT),
    "hash": st.one_of(st.just("a" * 64), st.just("g" * 64), st.just(" 0x" + "1" * 61), TEXT),
    "state": st.one_of(st.sampled_from(["active", "revoked", "out_of_scope"]), JSON),
    "limits": st.one_of(LIMITS, JSON)})
KEYS = st.fixed_dictionaries({}, optional={
    "version": st.one_of(TEXT, JSON), "require_key": JSON,
    "keys": st.one_of(st.lists(st.one_of(KEY_ENTRY, JSON), max_size=3), JSON)})


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def bodies(shaped: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """A route's bodies: mostly of its own shape, else anything."""
    return st.one_of(shaped.map(encode), shaped.map(encode), shaped.map(encode),
                     JSON.map(encode), st.binary(max_size=64), st.sampled_from(NASTY))


BODIES = {"/v1/chat/completions": bodies(CHAT_BODY), "/v1/completions": bodies(COMPLETION_BODY),
          "/admin/backends": bodies(BACKEND), "/admin/keys": bodies(KEYS)}
ANY_BODY = st.one_of(*(bodies(shaped) for shaped in (CHAT_BODY, COMPLETION_BODY, BACKEND, KEYS)))
AUTHORIZATION = st.one_of(
    st.none(), st.sampled_from([f"Bearer {ADMIN_TOKEN}", f"Bearer {KEY}", "Bearer", "bearer ",
                                f"Bearer {ADMIN_TOKEN[:-1]}", f"Basic {ADMIN_TOKEN}", KEY]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40))
QUERY = st.dictionaries(st.sampled_from(["role", "url", "x"]), st.one_of(
    st.sampled_from(["prefill", "decode", "http://127.0.0.1:1", "http://127.0.0.1:9/"]), TEXT),
    max_size=3)


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    body: bytes
    authorization: str | None = None
    query: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None
    content_type: str | None = "application/json"


@dataclass(frozen=True)
class RawCase:
    """A request written byte by byte: header values and path need not be UTF-8."""

    method: bytes
    path: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


# The inference routes, where most of the logic is, five times as often as the others; and,
# one request in seven, a method or path the router does not serve.
INFERENCE_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions")]
ELSEWHERE = [("GET", "/v1/completions"), ("POST", "/health"), ("PATCH", "/admin/keys"),
             ("HEAD", "/v1/models"), ("DELETE", "/admin/keys/usage"), ("OPTIONS", "/v1/chat/completions"),
             ("POST", "/v1/embeddings"), ("GET", "/"), ("PUT", "/admin"), ("GET", "/admin/keys/x")]
ROUTE = st.sampled_from(3 * (ROUTES + 4 * INFERENCE_ROUTES) + ELSEWHERE)
CASES = st.builds(
    lambda routed, authorization, query, request_id, content_type: Case(
        routed[0][0], routed[0][1], routed[1], authorization, query, request_id, content_type),
    ROUTE.flatmap(lambda route: st.tuples(st.just(route), BODIES.get(route[1], ANY_BODY))),
    AUTHORIZATION, QUERY,
    st.one_of(st.none(), st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                                 max_size=64)),
    st.sampled_from([None, "application/json", "text/plain", "application/x-www-form-urlencoded",
                     "multipart/form-data; boundary=x"]))
# Bytes a header value may carry in well-formed HTTP (visible ASCII, space, obs-text), and
# percent-escapes of any bytes for query strings: invalid UTF-8 reaches the router's handlers.
# (Malformed HTTP itself, a control byte in a header say, aiohttp's parser refuses with a 400
# before any route is involved.)
HEADER_BYTES = st.binary(min_size=1, max_size=24).map(
    lambda raw: bytes(b if 0x20 <= b <= 0x7E or b >= 0x80 else 0x41 for b in raw).strip() or b"x")
ESCAPED = st.binary(max_size=12).map(lambda raw: "".join(f"%{b:02X}" for b in raw).encode())
RAW_CASES = st.builds(
    lambda route, query, headers, body: RawCase(route[0].encode(), route[1].encode() + query,
                                                headers, body),
    st.sampled_from(ROUTES),
    st.one_of(st.just(b""), st.builds(lambda url, role: b"?url=" + url + b"&role=" + role,
                                      ESCAPED, ESCAPED)),
    st.dictionaries(st.sampled_from([b"X-Request-Id", b"Authorization", b"Content-Type"]),
                    st.one_of(HEADER_BYTES, st.sampled_from([
                        b"Bearer " + ADMIN_TOKEN.encode(), b"Bearer " + KEY.encode()])),
                    max_size=3).map(lambda headers: tuple(headers.items())),
    st.one_of(st.sampled_from(NASTY[:20]), COMPLETION_BODY.map(encode), CHAT_BODY.map(encode)))


# ---- running them -----------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


class Harness:
    """A router in front of two always-200 workers, on an event loop of the test's own (the
    hypothesis test is synchronous and runs each example to completion on it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, config: RouterConfig,
                 checker: PromptChecker, workers: list[Worker]) -> None:
        self.loop = loop
        self.router = Router(config, checker)
        self.server = TestServer(self.router.app())
        self.workers = workers
        self.session: ClientSession | None = None
        self.seen: Counter[str] = Counter()

    async def start(self) -> None:
        await self.server.start_server()
        self.session = ClientSession()
        await wait_until(lambda: all(pool.ready() for pool in self.router.registry.primary.pools.values()))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.server.close()

    def reset(self) -> None:
        # A fuzzed PUT /admin/keys may require keys from then on: every example starts from
        # the same key set, so later ones still reach the inference path.
        self.router.gate.replace(KEY_SET)

    async def send(self, case: Case) -> Answer:
        assert self.session is not None
        headers = {}
        if case.authorization is not None:
            headers["Authorization"] = case.authorization
        if case.request_id is not None:
            headers["X-Request-Id"] = case.request_id
        if case.content_type is not None:
            headers["Content-Type"] = case.content_type
        async with self.session.request(case.method, self.server.make_url(case.path),
                                        params=case.query, data=case.body, headers=headers) as response:
            body = await response.read()
            return Answer(response.status, response.content_type, body)

    async def send_raw(self, case: RawCase) -> Answer:
        reader, writer = await asyncio.open_connection(self.server.host, self.server.port)
        try:
            head = [case.method + b" " + case.path + b" HTTP/1.1", b"Host: fuzz", b"Connection: close",
                    b"Content-Length: %d" % len(case.body), *(name + b": " + value
                                                            for name, value in case.headers)]
            writer.write(b"\r\n".join(head) + b"\r\n\r\n" + case.body)
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
        return parse_http(data)


def parse_http(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith(b"HTTP/") else 0
    content_type = ""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-type":
            content_type = value.strip().split(b";")[0].decode()
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value:
            body = dechunk(body)
    return Answer(status, content_type, body)


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + rest[:size], rest[size + 2:]
    return out


def check_answer(answer: Answer, head: bool, what: object) -> str:
    """The answer is the router's own and well-formed; returns a short label of it."""
    assert answer.status != 0, f"no HTTP answer at all to {what!r}"
    assert answer.status < 500, f"{answer.status} {answer.body[:500]!r} for {what!r}"
    if answer.status < 400:
        return str(answer.status)
    if head:  # a HEAD answer has no body to check
        return f"{answer.status} HEAD"
    assert answer.content_type == "application/json", (answer.status, answer.body[:300], what)
    body = json.loads(answer.body)
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] == error_type(answer.status), error
    assert isinstance(error["message"], str) and error["message"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    # vLLM's own refusals, relayed, carry the status as their code.
    assert error["code"] is None or isinstance(error["code"], (str, int)), error
    return f"{answer.status} {error['param'] or error['code'] or '-'}"


CONFIGS = {
    # The console's default shape, the admin API on, keys and limits.
    "pd": {"admin_token": ADMIN_TOKEN},
    # pd_adaptive and prefix_aware tokenize every prompt; no admin token: the admin API is off.
    "pd-adaptive-no-admin": {"pd_policy": "pd_adaptive", "prefill_policy": "prefix_aware",
                             "decode_policy": "prefix_aware", "local_prefill_max_tokens": 4},
    # The hand-off carries kv_transfer_params from prefill's answer to decode.
    "nixl": {"admin_token": ADMIN_TOKEN, "kv_channel": "nixl"},
    "colocated": {"admin_token": ADMIN_TOKEN},
}


@pytest.fixture
def harness(request: pytest.FixtureRequest, tokenizer_dir: Path, make_checker: Any,
            tmp_path: Path) -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    workers = [Worker(), Worker()]
    for worker in workers:
        loop.run_until_complete(worker.server.start_server())
    name = request.param
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(KEY_SET))
    urls: dict[str, tuple[str, ...]] = (
        {"colocated_urls": tuple(w.url for w in workers)} if name == "colocated"
        else {"prefill_urls": (workers[0].url,), "decode_urls": (workers[1].url,)})
    config = RouterConfig(served_model_name=MODEL, tokenizer_path=str(tokenizer_dir),
                          max_model_len=64, health_interval_s=0.5, connect_timeout_s=0.5,
                          request_timeout_s=10.0, keys_file=str(keys_file), **urls,
                          **CONFIGS[name])
    config.validate()
    harness = Harness(loop, config, make_checker(64), workers)
    loop.run_until_complete(harness.start())
    try:
        yield harness
    finally:
        print(f"\n{name}: {sum(harness.seen.values())} requests; answers: "
              f"{dict(harness.seen.most_common())}")
        loop.run_until_complete(harness.close())
        for worker in workers:
            loop.run_until_complete(worker.server.close())
        loop.close()


FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("harness", sorted(CONFIGS), indirect=True)
def test_every_route_answers_every_request_without_a_server_error(harness: Harness) -> None:
    @FUZZ
    @given(case=CASES)
    def answers(case: Case) -> None:
        harness.reset()
        answer = harness.loop.run_until_complete(harness.send(case))
        harness.seen[check_answer(answer, case.method == "HEAD", case)] += 1

    answers()


# The worst cases take the same paths in every mode but the hand-off: two modes are enough.
@pytest.mark.parametrize("harness", ["pd", "pd-adaptive-no-admin"], indirect=True)
def test_every_route_answers_each_worst_case_without_a_server_error(harness: Harness) -> None:
    for method, path in ROUTES:
        for body in NASTY:
            # With the admin token, so that the admin routes read the body too.
            case = Case(method, path, body, f"Bearer {ADMIN_TOKEN}")
            answer = harness.loop.run_until_complete(harness.send(case))
            harness.seen[check_answer(answer, False, case)] += 1


@pytest.mark.parametrize("harness", ["pd"], indirect=True)
def test_bytes_that_are_not_utf_8_in_headers_and_paths_are_client_errors(harness: Harness) -> None:
    @FUZZ
    @given(case=RAW_CASES)
    def answers(case: RawCase) -> None:
        harness.reset()
        answer = harness.loop.run_until_complete(harness.send_raw(case))
        harness.seen[check_answer(answer, False, case)] += 1

    answers()

