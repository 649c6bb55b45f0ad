"""Which vLLM servers a test run started, and how long each took to start.

Servers are started by many hands (the supervisor a test's console runs, the borrowed
deployments, the quality suite's own), so rather than asking each of them, a thread watches the
machine's processes: a vLLM API server is any process whose command line runs vLLM's server
module, and it counts as started once it listens on a TCP port (vLLM listens only after its
engine is up). One that dies first counts too, with the time until it died. tests/suite_times.py
attributes each server to the suite whose test was running when it was created.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil

# What a vLLM API server's command line holds: pdserve's launcher runs vLLM's server module;
# `vllm serve` by hand shows the console script. The engine core's process renames itself
# (VLLM::EngineCore) and is one per server, so it is not counted again.
SERVER_MARKERS = ("vllm.entrypoints", "vllm serve")
POLL_S = 1.0
# psutil's create_time adds the process's start tick to a boot time that /proc/stat gives in
# whole seconds, so it may read up to a second early.
CLOCK_SLACK_S = 2.0


@dataclass
class Server:
    pid: int
    created: float
    ready: float | None = None
    gone: float | None = None

    @property
    def start_seconds(self) -> float | None:
        end = self.ready if self.ready is not None else self.gone
        return None if end is None else max(0.0, end - self.created)


def is_server(cmdline: list[str]) -> bool:
    line = " ".join(cmdline)
    return not line.startswith("VLLM::") and any(marker in line for marker in SERVER_MARKERS)


def engine_processes(pid: int) -> list[psutil.Process]:
    """A vLLM server's engine core, where the model runs on a CPU (renamed VLLM::...), and any
    worker process vLLM starts beside it: not its API server."""
    return [child for child in psutil.Process(pid).children(recursive=True)
            if " ".join(child.cmdline()).startswith("VLLM::")]


def listens(process: psutil.Process) -> bool:
    return any(c.status == psutil.CONN_LISTEN for c in process.net_connections(kind="tcp"))


class ServerWatch:
    """Polls the process table once a second in a daemon thread until ``stop``."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self.servers: dict[tuple[int, float], Server] = {}
        # Servers already running when the run began (a `make up` beside it) are not its own.
        self.since = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-starts", daemon=True)

    def start(self) -> None:
        self.since = time.time()
        self._thread.start()

    def stop(self) -> list[Server]:
        self._stop.set()
        self._thread.join(timeout=10)
        self.poll()  # a server that became ready since the last poll
        return list(self.servers.values())

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        seen: set[tuple[int, float]] = set()
        now = time.time()
        for process in psutil.process_iter(["cmdline", "create_time"]):
            cmdline, created = process.info["cmdline"], process.info["create_time"]
            if not cmdline or created is None or not is_server(cmdline):
                continue
            if created < self.since - CLOCK_SLACK_S:
                continue
            key = (process.pid, created)
            seen.add(key)
            server = self.servers.setdefault(key, Server(process.pid, created))
            if server.ready is None:
                try:
                    if listens(process):
                        server.ready = now
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    # Gone between the listing and the look: the next poll marks it gone.
                    continue
        for key, server in self.servers.items():
            if key not in seen and server.ready is None and server.gone is None:
                server.gone = now
