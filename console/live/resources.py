"""CPU, resident memory and GPU memory of a process and all its descendants, as the metrics
collector and a node agent's heartbeat report them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil

from console.live.gpu_memory import GpuMemory


class TreeUsage:
    """Keeps the psutil objects between readings: psutil measures CPU between two calls on the
    same object, so the first reading of a process is 0 % CPU."""

    def __init__(self, gpu_by_pid: Callable[[], dict[int, int]] | None = None) -> None:
        self._processes: dict[tuple[int, float], psutil.Process] = {}
        self._seen: set[tuple[int, float]] = set()
        self._gpu_by_pid = gpu_by_pid or GpuMemory().by_pid
        self._gpu: dict[int, int] | None = None  # read once a round (forget_unseen ends it)

    def measure(self, pid: int) -> dict[str, Any]:
        """``{"cpu": % of one core, "rss": bytes}``, None for both once the process is gone;
        and ``"gpu_mem"`` (bytes) where the GPU driver lists a process of the tree (vLLM's GPU
        memory is its engine's and workers', children of the pid started)."""
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
        reading: dict[str, Any] = {"cpu": round(cpu, 1), "rss": rss}
        if self._gpu is None:
            self._gpu = self._gpu_by_pid()
        on_gpu = [self._gpu[p.pid] for p in tree if p.pid in self._gpu]
        if on_gpu:
            reading["gpu_mem"] = sum(on_gpu)
        return reading

    def forget_unseen(self) -> None:
        """After a round of readings: drop the processes that round did not see."""
        for key in set(self._processes) - self._seen:
            del self._processes[key]
        self._seen = set()
        self._gpu = None
