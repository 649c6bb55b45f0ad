"""CPU and resident memory of a process and all its descendants, as the metrics collector and a
node agent's heartbeat report them."""

from __future__ import annotations

from typing import Any

import psutil


class TreeUsage:
    """Keeps the psutil objects between readings: psutil measures CPU between two calls on the
    same object, so the first reading of a process is 0 % CPU."""

    def __init__(self) -> None:
        self._processes: dict[tuple[int, float], psutil.Process] = {}
        self._seen: set[tuple[int, float]] = set()

    def measure(self, pid: int) -> dict[str, Any]:
        """``{"cpu": % of one core, "rss": bytes}``; None for both once the process is gone."""
        try:
            leader = psutil.Process(pid)
            tree = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return {"cpu": None, "rss": None}
        cpu, rss = 0.0, 0
        for found in tree:
            try:
                # The creation time tells a reused pid from the process measured before.
                key = (found.pid, found.create_time())
                process = self._processes.setdefault(key, found)
                with process.oneshot():
                    cpu += process.cpu_percent(None)
                    rss += process.memory_info().rss
            except psutil.Error:
                continue  # exited between listing and reading
            self._seen.add(key)
        return {"cpu": round(cpu, 1), "rss": rss}

    def forget_unseen(self) -> None:
        """After a round of readings: drop the processes that round did not see."""
        for key in set(self._processes) - self._seen:
            del self._processes[key]
        self._seen = set()
