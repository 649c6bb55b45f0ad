"""Active health probes: slow answers are tolerated a little, refusals are not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from inference.router.backends import SLOW_PROBES_TO_FAIL, Backend, Pool, open_sessions, probe


class SlowHealth:
    def __init__(self) -> None:
        self.delay_s = 0.0

    async def health(self, _request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay_s)
        return web.Response(text="ok")


@pytest_asyncio.fixture(loop_scope="function")
async def backend() -> AsyncIterator[tuple[Backend, SlowHealth]]:
    health = SlowHealth()
    app = web.Application()
    app.router.add_get("/health", health.health)
    server = TestServer(app)
    await server.start_server()
    pool = Pool("decode", (str(server.make_url("")).rstrip("/"),))
    await open_sessions([pool], connect_timeout_s=1.0)
    [member] = pool.backends
    yield member, health
    await member.client().close()
    await server.close()


async def test_a_busy_worker_survives_a_few_slow_probes(
        backend: tuple[Backend, SlowHealth]) -> None:
    member, health = backend
    await probe(member, timeout_s=0.2)
    assert member.healthy
    health.delay_s = 0.5
    for _ in range(SLOW_PROBES_TO_FAIL - 1):
        await probe(member, timeout_s=0.1)
        assert member.healthy
    await probe(member, timeout_s=0.1)
    assert not member.healthy
    assert "timed out" in member.last_error
    health.delay_s = 0.0
    await probe(member, timeout_s=0.2)
    assert member.healthy and member.slow_probes == 0


async def test_a_refused_connection_takes_a_worker_out_at_once(
        backend: tuple[Backend, SlowHealth]) -> None:
    member, _health = backend
    await probe(member, timeout_s=0.2)
    assert member.healthy
    await member.client().close()
    dead = Backend(url="http://127.0.0.1:1", role="decode", healthy=True)
    await open_sessions([_single(dead)], connect_timeout_s=0.5)
    await probe(dead, timeout_s=0.5)
    assert not dead.healthy
    await dead.client().close()


def _single(member: Backend) -> Pool:
    pool = Pool(member.role, ())
    pool.backends = [member]
    return pool
