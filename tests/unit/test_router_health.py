"""Active health probes: slow answers are tolerated a little, refusals are not."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from inference.router.backends import (
    PROBE_LATE_S,
    SLOW_PROBES_TO_FAIL,
    Backend,
    Pool,
    open_sessions,
    probe,
)


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


async def test_a_probe_the_router_itself_was_late_for_does_not_count(
        backend: tuple[Backend, SlowHealth]) -> None:
    """The router's event loop held up past the deadline (a synchronous step, a starved
    process): the timeout fires late, and that is no evidence against the worker."""
    member, health = backend
    await probe(member, timeout_s=0.2)
    health.delay_s = 1.0

    async def hold_the_loop() -> None:
        await asyncio.sleep(0.01)  # the probe's request is under way
        time.sleep(0.1 + PROBE_LATE_S + 0.2)

    for _ in range(SLOW_PROBES_TO_FAIL + 1):
        await asyncio.gather(probe(member, timeout_s=0.1), hold_the_loop())
    assert member.healthy and member.slow_probes == 0
    # Without the hold, the same slow answers take it out as before.
    for _ in range(SLOW_PROBES_TO_FAIL):
        await probe(member, timeout_s=0.1)
    assert not member.healthy


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


def test_rotation_changes_and_a_breaker_opening_are_logged_once_each(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pdserve.router.backends")
    healthy = Backend(url="http://127.0.0.1:1", role="decode", healthy=True)
    assert healthy.call_failed(threshold=1, cooldown_s=5.0)
    refused = Backend(url="http://127.0.0.1:2", role="decode", healthy=True)
    refused.mark(False, "ClientConnectorError")
    refused.mark(False, "ClientConnectorError")  # no change: no second line
    assert refused.call_failed(threshold=1, cooldown_s=5.0)
    refused.mark(True)
    assert [r.getMessage() for r in caplog.records] == [
        "decode http://127.0.0.1:1 out of rotation: circuit open: 1 failed calls in a row; "
        "probed again after 5 s",
        "decode http://127.0.0.1:2 out of rotation: ClientConnectorError",
        "decode http://127.0.0.1:2: circuit open: 1 failed calls in a row; probed again after 5 s",
        "decode http://127.0.0.1:2 in rotation",
    ]
