"""The default compute dtype follows the CPU's native bfloat16 instructions."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.cpu_dtype import cpu_flags, preferred_dtype

AVX2_ONLY = "fpu vme sse sse2 avx avx2 fma bmi2"


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nflags\t\t: {flags}\n")
    return path


@pytest.mark.parametrize(("flags", "dtype"), [
    (AVX2_ONLY, "float32"),
    (AVX2_ONLY + " avx512f avx512bw avx512_vnni", "float32"),
    (AVX2_ONLY + " avx512f avx512_bf16", "bfloat16"),
    (AVX2_ONLY + " amx_bf16 amx_tile amx_int8", "bfloat16"),
])
def test_bfloat16_only_where_the_cpu_multiplies_it(tmp_path: Path, flags: str,
                                                    dtype: str) -> None:
    assert preferred_dtype(cpu_flags(_cpuinfo(tmp_path, flags))) == dtype


def test_arm_lists_its_features_and_bf16_among_them(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n"
                    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16 i8mm\n")
    assert preferred_dtype(cpu_flags(path)) == "bfloat16"
    path.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull\n")
    assert preferred_dtype(cpu_flags(path)) == "float32"


def test_a_cpuinfo_without_flags_gives_float32(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\n")
    assert cpu_flags(path) == frozenset()
    assert preferred_dtype(cpu_flags(path)) == "float32"
