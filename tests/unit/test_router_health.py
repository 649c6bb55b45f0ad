"""Active health probes: slow answers are tolerated a little, refusals are not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from inference.health_rule import SLOW_PROBES_TO_FAIL, SLOW_PROBES_TO_FAIL_BUSY
from inference.router.backends import (
    PROBE_LATE_S,
    Backend,
    Breaker,
    Pool,
    open_sessions,
    probe,
    probe_forever,
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


async def test_a_worker_measured_busy_stays_in_rotation_through_a_slow_probe(
        backend: tuple[Backend, SlowHealth]) -> None:
    """Issue 25: under load (load average 24-30) one probe of a healthy decode timed out and it
    left rotation. Its recent answers were slow: its probes now wait longer (3x the slowest
    recent answer, up to 3x the base), and it needs a third slow probe to be out."""
    member, health = backend
    health.delay_s = 0.1  # loaded: answers take 0.1 s against a 0.2 s base deadline
    for _ in range(3):
        await probe(member, timeout_s=0.2)
    assert member.healthy
    # An answer slower than the base deadline but within the adapted one: no timeout at all.
    health.delay_s = 0.22
    await probe(member, timeout_s=0.2)
    assert member.healthy and member.slow_probes == 0
    # Slower than even the adapted deadline: out only at the third slow probe in a row.
    health.delay_s = 2.0
    for _ in range(SLOW_PROBES_TO_FAIL_BUSY - 1):
        await probe(member, timeout_s=0.2)
        assert member.healthy
    await probe(member, timeout_s=0.2)
    assert not member.healthy and "timed out 3 times" in member.last_error


async def test_a_killed_worker_is_out_within_a_second_even_beside_a_hung_one(
        backend: tuple[Backend, SlowHealth]) -> None:
    """Each worker is probed on its own: a hung worker's long deadline holds up no other's
    probe, and a killed one (connection refused) is out at its next probe."""
    member, health = backend
    health.delay_s = 0.4  # busy: its deadline grows past the interval (3 x 0.4 s)
    app = web.Application()
    app.router.add_get("/health", SlowHealth().health)
    other_server = TestServer(app)
    await other_server.start_server()
    other = Pool("prefill", (str(other_server.make_url("")).rstrip("/"),))
    await open_sessions([other], connect_timeout_s=1.0)
    [victim] = other.backends
    pools = [_single(member), other]
    task = asyncio.create_task(probe_forever(lambda: pools, interval_s=0.5))
    try:
        deadline = time.monotonic() + 3
        while not (member.healthy and victim.healthy) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert member.healthy and victim.healthy
        health.delay_s = 30.0  # member hangs
        await asyncio.sleep(0.3)
        await other_server.close()  # victim is killed: its port refuses connections
        killed = time.monotonic()
        while victim.healthy and time.monotonic() - killed < 2:
            await asyncio.sleep(0.01)
        assert not victim.healthy
        assert time.monotonic() - killed < 1.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await victim.client().close()


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
    opened: list[str] = []
    breaker = Breaker(failures=1, cooldown_s=5.0, on_open=lambda b: opened.append(b.url))
    healthy = Backend(url="http://127.0.0.1:1", role="decode", healthy=True, breaker=breaker)
    healthy.call_failed()
    refused = Backend(url="http://127.0.0.1:2", role="decode", healthy=True, breaker=breaker)
    refused.mark(False, "ClientConnectorError")
    refused.mark(False, "ClientConnectorError")  # no change: no second line
    refused.call_failed()
    refused.call_failed()  # open already: neither logged nor counted again
    refused.mark(True)
    assert opened == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert [r.getMessage() for r in caplog.records] == [
        "decode http://127.0.0.1:1 out of rotation: circuit open: 1 failed calls in a row; "
        "probed again after 5 s",
        "decode http://127.0.0.1:2 out of rotation: ClientConnectorError",
        "decode http://127.0.0.1:2: circuit open: 1 failed calls in a row; probed again after 5 s",
        "decode http://127.0.0.1:2 in rotation",
    ]
