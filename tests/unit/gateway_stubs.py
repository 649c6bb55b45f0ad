"""Stand-ins for the gateway's unit tests: stub deployment routers that record what reached
them and answer JSON or SSE (or an error) at the test's word, a gateway on a test server, and
the configuration helpers. The fixtures are registered in tests/unit/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from inference.gateway.config import parse_config
from inference.gateway.server import Gateway
from inference.router.keys import key_hash, public_prefix

ADMIN = "gateway-admin-token-8c1d"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


@dataclass
class Seen:
    path_qs: str
    raw: bytes
    headers: Mapping[str, str]

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)


@dataclass
class StubRouter:
    """A deployment's router as the gateway sees it: POST /v1/... answered with JSON naming the
    stub, or SSE events when the body asks for a stream."""

    name: str
    requests: list[Seen] = field(default_factory=list)
    # Answer every request with this status and an OpenAI error body (Retry-After: 7).
    fail_with: int | None = None
    chunks: int = 3
    # A stream pauses after its first event until the test sets this.
    gate: asyncio.Event | None = None
    # A stream goes on until its client leaves, then sets this.
    endless: bool = False
    # Drop the connection after the first event (a stream) or half the body (JSON).
    dies: bool = False
    client_left: asyncio.Event = field(default_factory=asyncio.Event)
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/{tail:.+}", self._serve)
        self.server = TestServer(app)
        await self.server.start_server()

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.requests.append(Seen(request.path_qs, raw, request.headers.copy()))
        if self.fail_with is not None:
            error = {"error": {"message": f"{self.name}: no worker ready", "type": "InternalServerError",
                               "param": None, "code": "decode_unavailable"}}
            return web.json_response(error, status=self.fail_with, headers={"Retry-After": "7"})
        body = json.loads(raw)
        own = {"X-Pdserve-Revision": "2", "X-Request-Id": request.headers.get("X-Request-Id", "")}
        if not body.get("stream"):
            if self.dies:
                return await self._die_in_body(request, own)
            return web.json_response({"from": self.name, "model": body.get("model")}, headers=own)
        response = web.StreamResponse(headers={**own, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for event in self.events():
                await response.write(event)
                if self.dies:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if self.gate is not None:
                    await self.gate.wait()
            while self.endless:
                await response.write(b": still here\n\n")
                await asyncio.sleep(0.02)
        except ConnectionResetError:
            self.client_left.set()
            return response
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a request whose client closed the connection.
            self.client_left.set()
            raise
        await response.write_eof()
        return response

    @staticmethod
    async def _die_in_body(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
        response.content_length = 100
        await response.prepare(request)
        await response.write(b'{"from": ')
        assert request.transport is not None
        request.transport.close()
        return response

    def events(self) -> list[bytes]:
        return [f"data: {json.dumps({'from': self.name, 'n': i})}\n\n".encode()
                for i in range(self.chunks)] + [b"data: [DONE]\n\n"]


@pytest_asyncio.fixture(loop_scope="function")
async def make_router() -> AsyncIterator[Callable[[str], Awaitable[StubRouter]]]:
    stubs: list[StubRouter] = []

    async def make(name: str) -> StubRouter:
        stub = StubRouter(name)
        await stub.start()
        stubs.append(stub)
        return stub

    yield make
    for stub in stubs:
        assert stub.server is not None
        await stub.server.close()


@dataclass
class RunningGateway:
    gateway: Gateway
    client: TestClient

    async def metric(self, name: str, labels: dict[str, str]) -> float:
        text = await (await self.client.get("/metrics")).text()
        return sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples if sample.name == name and sample.labels == labels)


StartGateway = Callable[..., Awaitable[RunningGateway]]


@pytest_asyncio.fixture(loop_scope="function")
async def start_gateway() -> AsyncIterator[StartGateway]:
    clients: list[TestClient] = []

    async def start(config: dict[str, Any] | None = None, admin_token: str | None = ADMIN
                    ) -> RunningGateway:
        gateway = Gateway(parse_config(config) if config is not None else None, admin_token)
        client = TestClient(TestServer(gateway.app()))
        await client.start_server()
        clients.append(client)
        return RunningGateway(gateway, client)

    yield start
    for client in clients:
        await client.close()


def deployment(name: str, router: str | None, team: str = "default",
               state: str = "running") -> dict[str, Any]:
    return {"name": name, "served_model_name": f"model-{name}", "router": router, "state": state,
            "team": team}


def configuration(*deployments: dict[str, Any], aliases: dict[str, list[str]] | None = None,
                  keys: tuple[dict[str, Any], ...] = (), require_key: bool = False,
                  version: str = "v1") -> dict[str, Any]:
    return {"version": version, "require_key": require_key, "deployments": list(deployments),
            "aliases": [{"name": name, "targets": targets} for name, targets in (aliases or {}).items()],
            "keys": list(keys)}


def key_entry(key: str, key_id: int, deployments: list[str], state: str = "active") -> dict[str, Any]:
    return {"id": key_id, "prefix": public_prefix(key), "hash": key_hash(key), "state": state,
            "deployments": deployments}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def not_found(model: str) -> dict[str, Any]:
    return {"error": {"message": f"The model '{model}' does not exist or you do not have access to it.",
                      "type": "NotFoundError", "param": "model", "code": "model_not_found"}}
