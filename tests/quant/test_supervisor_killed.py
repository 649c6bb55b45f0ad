"""A gate run whose supervisor is SIGKILLed: the reference vLLM server goes with it, and the next
supervisor runs the gate again to its verdict, through the quant stack's console, supervisor
and Celery worker and the tiny random-weight Llama."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from tests.console.sockets import free_port
from tests.quant.conftest import REPO, QuantStack

pytestmark = pytest.mark.vllm


def call(stack: QuantStack, method: str, path: str, **kwargs: Any) -> Any:
    with stack.api() as client:
        response = client.request(method, path, **kwargs)
    assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def reference_servers(stack: QuantStack) -> list[psutil.Process]:
    supervisor = psutil.Process(stack.processes["supervisor"].pid)
    return [p for p in supervisor.children()
            if "--served-model-name reference" in " ".join(p.cmdline())]


def wait(what: str, check: Any, timeout_s: float, interval_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(interval_s)
    return value


def test_a_gate_whose_supervisor_is_killed_loses_its_reference_and_runs_again(
        quant_stack: QuantStack) -> None:
    created = call(quant_stack, "POST", "/api/v1/deployments/", json={
        "name": "gate-kill", "base_model": "tiny", "served_model_name": "tiny",
        "max_model_len": 2048, "longest_request": 2048, "kv_cache_gib": 1, "dtype": "float32",
        "kv_channel": "shared-storage", "sampling_defaults": {"temperature": 0},
        "gate": {"mode": "on", "prompts": 2},
        "prefill": {"variant": "tiny/bf16", "instances": [{"cpu_cores": "0", "port": free_port()}]},
        "decode": {"variant": "tiny/bf16", "instances": [{"cpu_cores": "1", "port": free_port()}]},
        "router": {"port": free_port()},
    })
    assert created["checks"]["ok"], created["checks"]
    deployment = created["id"]
    try:
        call(quant_stack, "POST", f"/api/v1/deployments/{deployment}/start")
        # Mid-gate: both workers ready, the reference server started by the supervisor.
        server = wait("reference server", lambda: reference_servers(quant_stack), 420)[0]
        gate = call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/gate")["results"][0]
        assert gate["state"] == "running"

        quant_stack.processes["supervisor"].send_signal(signal.SIGKILL)
        quant_stack.processes["supervisor"].wait(timeout=10)
        gone, alive = psutil.wait_procs([server], timeout=10)
        assert alive == [], "the reference server outlived its supervisor by 10 s"

        quant_stack.processes["supervisor"] = subprocess.Popen(
            [sys.executable, "manage.py", "supervise"], cwd=REPO, env=quant_stack.env,
            stdout=subprocess.DEVNULL,
            stderr=open(quant_stack.data_dir / "supervisor.log", "ab"))  # noqa: SIM115
        # (Its workers are "failed" for a moment: the new supervisor killed the ones it found
        # orphaned, and starts them again.)
        body = wait("ready deployment", lambda: (
            b if (b := call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/"))["state"]
            in ("ready", "blocked") else None), 600)
        summary = call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/gate")
        again = next(r for r in summary["results"] if r["id"] == gate["id"])
        # The same gate, queued again by the new supervisor and run to its verdict.
        assert again["state"] == "passed", again
        assert body["state"] == "ready", body
        assert reference_servers(quant_stack) == []
    finally:
        call(quant_stack, "POST", f"/api/v1/deployments/{deployment}/stop")
        wait("stopped deployment", lambda: call(
            quant_stack, "GET", f"/api/v1/deployments/{deployment}/")["state"] == "stopped", 120)
