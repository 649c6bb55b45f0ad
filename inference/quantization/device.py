"""Which FP8 the serving device can run: vLLM's FP8 linear kernels need a recent NVIDIA GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# vLLM 0.32 CompressedTensorsW8A8Fp8.get_min_capability(): Ada Lovelace (8.9) and newer.
FP8_MIN_CAPABILITY = (8, 9)


def fp8_device() -> tuple[bool, str]:
    """``(supported, description of the device)``."""
    gpus = _nvidia_gpus()
    if gpus:
        name, capability = max(gpus, key=lambda gpu: gpu[1])
        shown = f"{name} (compute capability {capability[0]}.{capability[1]})"
        return capability >= FP8_MIN_CAPABILITY, shown
    return False, f"CPU {_cpu_name()}, no NVIDIA GPU (nvidia-smi found none)"


def _nvidia_gpus() -> list[tuple[str, tuple[int, int]]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in result.stdout.splitlines():
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            gpus.append((name.strip(), (int(major), int(minor))))
    return gpus


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "(unknown model)"
