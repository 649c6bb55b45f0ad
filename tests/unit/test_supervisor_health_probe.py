"""The supervisor's health probe under load (issue 25): a ready child measured busy is not
marked failing by one slow probe; a child whose connection is refused fails at once."""

from __future__ import annotations

import time

import httpx

from console.supervisor.health_probe import PROBE_TIMEOUT_S, probe_health
from inference.health_rule import SLOW_PROBES_TO_FAIL, SLOW_PROBES_TO_FAIL_BUSY, ProbeRule

URL = "http://127.0.0.1:8200"


class Worker:
    """A child's /health: answers after ``delay_s``, times out past the probe's deadline, or
    refuses (killed)."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.killed = False
        self.deadlines: list[float] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]["read"]
        self.deadlines.append(timeout)
        if self.killed:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if self.delay_s > timeout:
            time.sleep(timeout)
            raise httpx.ReadTimeout("timed out", request=request)
        time.sleep(self.delay_s)
        return httpx.Response(200)


def client(worker: Worker) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(worker.handle))


def test_a_busy_ready_child_stays_healthy_through_a_slow_probe() -> None:
    worker, rule = Worker(), ProbeRule()
    http = client(worker)
    worker.delay_s = 0.2  # loaded: answers take 0.2 s against a 0.5 s deadline
    for _ in range(3):
        assert probe_health(http, URL, rule, ready=True) == (True, "")
    # Its deadline has grown with its answers: a 0.55 s answer is no timeout at all.
    worker.delay_s = 0.55
    assert probe_health(http, URL, rule, ready=True) == (True, "")
    assert worker.deadlines[-1] > PROBE_TIMEOUT_S
    # Slower than even that: failing only at the third slow probe in a row.
    worker.delay_s = 5.0
    results = [probe_health(http, URL, rule, ready=True)[0]
               for _ in range(SLOW_PROBES_TO_FAIL_BUSY)]
    assert results == [True] * (SLOW_PROBES_TO_FAIL_BUSY - 1) + [False]


def test_an_idle_child_fails_at_the_second_slow_probe_and_a_starting_one_at_the_first() -> None:
    worker, rule = Worker(), ProbeRule()
    http = client(worker)
    assert probe_health(http, URL, rule, ready=True)[0]
    worker.delay_s = 5.0
    results = [probe_health(http, URL, rule, ready=True)[0] for _ in range(SLOW_PROBES_TO_FAIL)]
    assert results == [True] * (SLOW_PROBES_TO_FAIL - 1) + [False]
    # A starting child is ready only once it answers.
    assert not probe_health(http, URL, ProbeRule(), ready=False)[0]


def test_a_killed_child_fails_its_next_probe_at_once() -> None:
    worker, rule = Worker(), ProbeRule()
    http = client(worker)
    worker.delay_s = 0.3
    for _ in range(3):
        assert probe_health(http, URL, rule, ready=True)[0]
    worker.killed = True
    started = time.monotonic()
    assert probe_health(http, URL, rule, ready=True) == (False, "")
    assert time.monotonic() - started < 1.0
    assert rule.latencies == type(rule.latencies)([])  # a new process starts with no history
