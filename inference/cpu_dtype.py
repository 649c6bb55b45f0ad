"""The dtype a CPU worker should compute a 16-bit checkpoint in, from the CPU's instruction set.

bfloat16 is the faster one only where the CPU multiplies it natively (AVX512_BF16 or AMX): there
float32 was about 3x slower in prefill (README, "The default deployment"). Without them torch
falls back from oneDNN and converts every element: on a 2-core AMD EPYC with AVX2 only, a
256 x 576 by 576 x 1536 linear took 51.6 ms in bfloat16 against 6.3 ms in float32, one thread
(vLLM logs "Failed to create oneDNN linear, fallback to torch linear").
"""

from __future__ import annotations

from pathlib import Path

# /proc/cpuinfo's names of the native bfloat16 instructions.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (every core of one machine has the same)."""
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    raise ValueError(f"{cpuinfo}: no flags line")


def preferred_dtype(flags: frozenset[str]) -> str:
    return "bfloat16" if flags & BF16_FLAGS else "float32"
