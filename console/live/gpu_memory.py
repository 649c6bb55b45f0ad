"""GPU memory per process from NVML, the driver's own accounting (what nvidia-smi lists): the
collector and a node agent's heartbeat add each process tree's GPU memory to its reading, for
the verification report's resources section. A machine without the driver (a CPU node) is
asked once and then not again."""

from __future__ import annotations

import logging

import pynvml

log = logging.getLogger("pdserve.metrics")


class GpuMemory:
    def __init__(self) -> None:
        self._available: bool | None = None  # None: not asked yet

    def by_pid(self) -> dict[int, int]:
        """Bytes of GPU memory each process holds, over all GPUs; {} without a driver."""
        if self._available is False:
            return {}
        try:
            if self._available is None:
                pynvml.nvmlInit()
                self._available = True
            used: dict[int, int] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    # None where the driver cannot tell (some virtualised GPUs).
                    if process.usedGpuMemory is not None:
                        used[process.pid] = used.get(process.pid, 0) + int(process.usedGpuMemory)
            return used
        except pynvml.NVMLError as exc:
            if self._available is None:
                self._available = False
                log.info("no NVIDIA driver here (%s): GPU memory is not sampled", exc)
            else:
                log.warning("reading GPU memory failed, this round has none: %s", exc)
            return {}
