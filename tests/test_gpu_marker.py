"""Tests marked ``gpu`` run where ``nvidia-smi -L`` lists a GPU and are skipped elsewhere with the
reason (tests/conftest.py). nvidia-smi is replaced by scripts on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import no_gpu_reason

pytest_plugins = ["pytester"]


def fake_nvidia_smi(directory: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = directory / "nvidia-smi"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", str(directory))


def test_a_listed_gpu_means_no_reason_to_skip(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)"', monkeypatch)
    assert no_gpu_reason() == ""


@pytest.mark.parametrize(("script", "reason"), [
    ('echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2; '
     "exit 9", "nvidia-smi -L failed with exit code 9: NVIDIA-SMI has failed because it could "
               "not communicate with the NVIDIA driver."),
    ("exit 0", "nvidia-smi -L lists no GPU"),
])
def test_a_failing_or_empty_nvidia_smi_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     script: str, reason: str) -> None:
    fake_nvidia_smi(tmp_path, script, monkeypatch)
    assert no_gpu_reason() == reason


def test_no_nvidia_smi_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert no_gpu_reason() == "no nvidia-smi on this machine (no NVIDIA driver)"


def test_only_gpu_marked_tests_are_skipped(pytester: pytest.Pytester,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(pytester.path))
    pytester.makeconftest("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n    vllm: starts vLLM\n")
    pytester.makepyfile(test_marked=(
        "import pytest\n\n"
        "@pytest.mark.gpu\ndef test_on_a_gpu():\n    pass\n\n"
        "def test_anywhere():\n    pass\n"))
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider", "-p", "no:django",
                                "-p", "no:asyncio")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*marker gpu: no nvidia-smi on this machine*"])
