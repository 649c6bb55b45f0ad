"""A gate run whose supervisor is SIGKILLed: the reference vLLM server goes with it, the next
supervisor adopts the workers and runs the gate again to its verdict, through the quant stack's
console, supervisor and Celery worker and the tiny random-weight Llama."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest

from inference import reference_cache
from tests.console.sockets import free_port, wait_for
from tests.quant.conftest import REPO, QuantStack
from tests.tiny_llama import TEST_CACHE_DIR

pytestmark = pytest.mark.vllm


def call(stack: QuantStack, method: str, path: str, **kwargs: Any) -> Any:
    response = stack.call(method, path, **kwargs)
    assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def state(stack: QuantStack, deployment: int) -> str:
    return str(call(stack, "GET", f"/api/v1/deployments/{deployment}/")["state"])


def reference_servers(stack: QuantStack) -> list[psutil.Process]:
    supervisor = psutil.Process(stack.processes["supervisor"].pid)
    return [p for p in supervisor.children()
            if "--served-model-name reference" in " ".join(p.cmdline())]


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
    # This gate must ask a live reference server: answers an earlier gate or measurement of the
    # tiny model kept (inference/reference_cache.py) would spare it one.
    kept = TEST_CACHE_DIR / reference_cache.SUBDIR
    if kept.exists():
        shutil.rmtree(kept)
    try:
        call(quant_stack, "POST", f"/api/v1/deployments/{deployment}/start")
        # Mid-gate: both workers ready, the reference server started by the supervisor.
        wait_for(lambda: bool(reference_servers(quant_stack)), "the reference server", 420, interval=0.5)
        server = reference_servers(quant_stack)[0]
        gate = call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/gate")["results"][0]
        assert gate["state"] == "running"
        workers = {p["slot"]: p["pid"] for p in call(
            quant_stack, "GET", f"/api/v1/deployments/{deployment}/")["processes"]}

        quant_stack.processes["supervisor"].send_signal(signal.SIGKILL)
        quant_stack.processes["supervisor"].wait(timeout=10)
        gone, alive = psutil.wait_procs([server], timeout=10)
        assert alive == [], "the reference server outlived its supervisor by 10 s"

        quant_stack.processes["supervisor"] = subprocess.Popen(
            [sys.executable, "manage.py", "supervise"], cwd=REPO, env=quant_stack.env,
            stdout=subprocess.DEVNULL,
            stderr=open(quant_stack.data_dir / "supervisor.log", "ab"))  # noqa: SIM115
        # The new supervisor adopts the workers, which went on running, and runs the gate again.
        wait_for(lambda: state(quant_stack, deployment) in ("ready", "blocked"),
                 "a ready or blocked deployment", 600, interval=1.0)
        body = call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/")
        summary = call(quant_stack, "GET", f"/api/v1/deployments/{deployment}/gate")
        again = next(r for r in summary["results"] if r["id"] == gate["id"])
        # The same gate, queued again by the new supervisor and run to its verdict.
        assert again["state"] == "passed", again
        assert body["state"] == "ready", body
        assert {p["slot"]: p["pid"] for p in body["processes"] if p["slot"] in workers} == workers
        assert reference_servers(quant_stack) == []
    finally:
        call(quant_stack, "POST", f"/api/v1/deployments/{deployment}/stop")
        wait_for(lambda: state(quant_stack, deployment) == "stopped", "the deployment stopped",
                 120, interval=1.0)
