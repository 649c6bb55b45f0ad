"""What the fault matrix (tests/e2e/test_fault_matrix.py) and the live tests that borrow its
tools use: a load of four concurrent clients that records every request's outcome, polling,
and the borrowed deployment's parts (a worker's URL and its place in a router's pools, a
process started again, `manage.py up`'s children, a router of a test's own in front of the
borrowed workers)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from inference.worker_auth import ROUTER_WORKER_KEY_ENV
from tests.borrowed import FACILITY, Handle
from tests.console.sockets import free_port
from tests.e2e.test_failover import PROMPT, events

CLIENTS = 4
# What a case may wait for a process the supervisor restarts (a tiny-model vLLM worker starts in
# 30-60 s on this machine, and took over 3 minutes while other suites ran beside it).
BACK_TIMEOUT_S = 300.0
# Between one client's requests while a killed worker starts again (Load.restarting): two
# requests a second still reach the degraded deployment. At 0.5 s (eight a second) the tiny
# worker's restart took 94-139 s under them, against 25 s on an idle machine.
RESTART_PACE_S = 2.0


# ---- the load ----------------------------------------------------------------------------
@dataclass
class Result:
    started: float
    ended: float
    stream: bool
    outcome: str  # "ok", or what went wrong: "refused", "http 503 ...", "error event ...", "cut"

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


@dataclass
class Load:
    """Four clients in threads, each sending short completions one after the other, streamed
    and not in turn, until stopped.

    While a killed worker starts again, ``restarting()`` has each client wait ``RESTART_PACE_S``
    between requests: requests keep arriving at the degraded deployment, but vLLM's start gets
    the cores (four clients without pause made each restart take about 3 minutes on two cores).
    ``restarted()`` makes the load full again.
    """

    router: str
    headers: dict[str, str] = field(default_factory=dict)
    # A distinct prompt per request (a counter in front): with shared storage, a prompt already
    # saved is not saved again, and the KV directory cases need every request to save.
    unique_prompts: bool = False
    results: list[Result] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _counter: Iterator[int] = field(default_factory=itertools.count)
    _pace_s: float = 0.0

    def restarting(self) -> None:
        self._pace_s = RESTART_PACE_S

    def restarted(self) -> None:
        self._pace_s = 0.0

    def __enter__(self) -> Load:
        for index in range(CLIENTS):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)

    def _client(self, index: int) -> None:
        with httpx.Client(timeout=60, headers=self.headers) as http:
            for turn in itertools.count():
                if self._stop.is_set():
                    return
                number = next(self._counter)
                prompt = f"Request {number}. {PROMPT}" if self.unique_prompts else PROMPT
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 16 + number % 17,
                        "ignore_eos": True}
                stream = (index + turn) % 2 == 0
                started = time.monotonic()
                outcome = self._send(http, body, stream)
                self.results.append(Result(started, time.monotonic(), stream, outcome))
                if outcome == "refused":
                    time.sleep(0.25)  # a closed port refuses at once: do not spin
                elif self._pace_s:
                    self._stop.wait(self._pace_s)

    def _send(self, http: httpx.Client, body: dict[str, Any], stream: bool) -> str:
        url = f"{self.router}/v1/completions"
        try:
            if not stream:
                response = http.post(url, json=body)
                if response.status_code == 200 and response.json().get("choices"):
                    return "ok"
                return f"http {response.status_code} {response.text[:200]}"
            with http.stream("POST", url, json={**body, "stream": True}) as response:
                if response.status_code != 200:
                    return f"http {response.status_code} {response.read()[:200]!r}"
                data = events(list(response.iter_lines()))
            errors = [event for event in data if '"error"' in event]
            if errors:
                return f"error event {errors[0][:200]}"
            return "ok" if data and data[-1] == "[DONE]" else "cut"
        except httpx.ConnectError:
            return "refused"
        except httpx.HTTPError as exc:
            return f"transport {type(exc).__name__}: {exc}"

    def snapshot(self) -> list[Result]:
        return list(self.results)

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        """Until ``count`` more requests have ended (the load is under way)."""
        target = len(self.results) + count
        wait_for(lambda: len(self.results) >= target, f"{count} requests of the load", timeout_s)


def failed(results: list[Result]) -> list[Result]:
    return [r for r in results if not r.ok]


def first_ok_started_after(results: list[Result], moment: float) -> float | None:
    """When the first request that started at ``moment`` or later succeeded."""
    ends = [r.ended for r in results if r.ok and r.started >= moment]
    return min(ends) if ends else None


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float,
          interval_s: float = 0.05) -> float:
    """Poll ``condition`` until true; return how long it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)
    return time.monotonic() - started


def quiet(call: Callable[[], bool]) -> Callable[[], bool]:
    """``call``, false while what it asks cannot answer (a restarting router or console)."""
    def guarded() -> bool:
        try:
            return call()
        except (httpx.HTTPError, ValueError, KeyError):
            return False
    return guarded


# ---- the deployment's parts ----------------------------------------------------------------
def worker_url(handle: Handle, slot: str) -> str:
    [worker] = [w for w in handle.deployment()["workers"] if w["slot"] == slot]
    return f"http://127.0.0.1:{worker['port']}"


def member(router: str, url: str) -> dict[str, Any]:
    """Worker ``url`` as ``router``'s /health lists it (ready, in_flight, error)."""
    health = httpx.get(f"{router}/health", timeout=5).json()
    for info in health["roles"].values():
        for backend in info["backends"]:
            if backend["url"] == url:
                return dict(backend)
    raise AssertionError(f"{url} is not in {router}'s pools: {health}")


def ready_again(handle: Handle, slot: str, old_pid: int) -> Callable[[], bool]:
    """The console says ``slot`` is ready in a process other than ``old_pid``."""
    def check() -> bool:
        process = handle.processes()[slot]
        return process["state"] == "ready" and process["pid"] not in (None, old_pid)
    return quiet(check)


def up_child(marker: str) -> psutil.Process:
    """The borrowed deployment's live ``manage.py up`` child whose command line has ``marker``
    (a killed one stays a zombie until `up` reaps it)."""
    [up] = [p for p in FACILITY.pids() if _cmdline(p)[-2:] == ["up", "--no-start"]]
    [child] = [c for c in psutil.Process(up).children() if marker in " ".join(_cmdline(c.pid))]
    return child


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


@contextmanager
def router_of_its_own(handle: Handle, logs: Path, env: dict[str, str] | None = None,
                      args: tuple[str, ...] = ()) -> Iterator[str]:
    """A router in front of the borrowed workers that sends every prompt through prefill."""
    port = free_port()
    model = _model_path(handle)
    log = open(logs / f"router-{port}.log", "wb")  # noqa: SIM115 - closed below
    router = subprocess.Popen(
        [sys.executable, "-m", "inference.router", "--served-model-name", "tiny",
         "--tokenizer", model, "--max-model-len", "2048", "--port", str(port),
         "--prefill", worker_url(handle, "prefill-0"), "--decode", worker_url(handle, "decode-0"),
         "--pd-policy", "remote", "--local-prefill-max-tokens", "0", *args],
        # The workers refuse callers without their deployment's key, as they refuse strangers.
        env={**os.environ, ROUTER_WORKER_KEY_ENV: handle.worker_headers()[
            "Authorization"].removeprefix("Bearer "), **(env or {})},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(quiet(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200),
              "the test's router healthy", 60, interval_s=0.2)
        yield url
    finally:
        os.killpg(router.pid, signal.SIGKILL)
        router.wait()
        log.close()


def _model_path(handle: Handle) -> str:
    """The tiny model's directory, from the router's command line as the supervisor ran it."""
    argv = psutil.Process(handle.processes()["router"]["pid"]).cmdline()
    return argv[argv.index("--tokenizer") + 1]


def planned_pids(handle: Handle) -> dict[str, int]:
    return {slot: process["pid"] for slot, process in handle.processes().items()}


def listeners(port: int) -> set[int]:
    """The pids listening on ``port``."""
    return {c.pid for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
