"""Quantization for real: the builder CLI in .venv-quant on a tiny random-weight Llama, a real
Celery worker and console, vLLM serving what was built.

The tiny model has SmolLM2's tokenizer and chat template (from the default model directory,
which `make test` prepares) and random weights: these tests are about files, processes and
kernels, not about text quality.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.console.sockets import free_port
from tests.console_api import ConsoleApi, admin_token, spawn_console
from tests.tiny_llama import build_tiny_llama

REPO = Path(__file__).resolve().parents[2]
QUANT_PYTHON = REPO / ".venv-quant" / "bin" / "python"
SMOLLM2 = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR", REPO / "data" / "models" / "smollm2-135m-instruct"))
ADMIN_PASSWORD = "quant-admin-password"


def build_random_llama(out: Path, *, layers: int) -> Path:
    """The tiny Llama in bf16, like the default model, once the default model's tokenizer is
    there to copy."""
    if not (SMOLLM2 / "tokenizer.json").is_file():
        subprocess.run([sys.executable, "-m", "inference.prepare_model", "--out", str(SMOLLM2)],
                       cwd=REPO, check=True)
    return build_tiny_llama(SMOLLM2, out, layers=layers, dtype="bfloat16")


Events = list[dict[str, Any]]


def quantize(model: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Events]:
    """Run the builder CLI as the console does; return the process and its progress events."""
    result = subprocess.run([str(QUANT_PYTHON), "-m", "inference.quantize", "--model", str(model),
                             "--out", str(out), *args], cwd=REPO, capture_output=True, text=True,
                            timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return result, [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not QUANT_PYTHON.exists():
        pytest.fail(f"{QUANT_PYTHON} is missing: run `make install` (scripts/install-quant.sh)")
    return build_random_llama(tmp_path_factory.mktemp("tiny") / "bf16", layers=4)


@dataclass
class QuantStack(ConsoleApi):
    """A console (uvicorn), the supervisor and a Celery worker on a data directory of their own."""

    data_dir: Path
    env: dict[str, str]
    console: str
    token: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_worker(self) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / "worker.log", "ab")  # noqa: SIM115 - closed with the process
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console.celery", "--quiet", "worker", "--pool",
             "solo", "--concurrency", "1", "--loglevel", "INFO", "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes["worker"] = worker
        return worker

    def job(self, job_id: int) -> dict[str, Any]:
        with self.api() as client:
            response = client.get(f"/api/v1/quantization-jobs/{job_id}/")
            response.raise_for_status()
            return response.json()

    def wait_job(self, job_id: int, until: Any, timeout_s: float = 180) -> tuple[dict[str, Any], Events]:
        """Poll the job until ``until(job)``; return it and every distinct state seen."""
        deadline = time.monotonic() + timeout_s
        seen: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            body = self.job(job_id)
            if not seen or (body["percent"], body["state"]) != (seen[-1]["percent"], seen[-1]["state"]):
                seen.append(body)
            if until(body):
                return body, seen
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} did not get there in {timeout_s} s: {seen[-1:]}")


@pytest.fixture(scope="session")
def quant_stack(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> Iterator[QuantStack]:
    data_dir = tmp_path_factory.mktemp("quant-data")
    env = {**os.environ, "PDSERVE_DATA_DIR": str(data_dir), "DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
    subprocess.run([*manage, "createsuperuser", "--noinput", "--username", "admin", "--email", ""],
                   cwd=REPO, env=env, check=True, capture_output=True)
    port = free_port()
    stack = QuantStack(data_dir=data_dir, env=env, console=f"http://127.0.0.1:{port}")
    stack.processes.update(spawn_console(env, data_dir, port))
    stack.start_worker()
    try:
        stack.token = admin_token(stack.console, ADMIN_PASSWORD)
        with stack.api() as client:
            client.post("/api/v1/models/", json={"name": "tiny"}).raise_for_status()
            client.post("/api/v1/variants/", json={"base_model": "tiny", "name": "bf16",
                                                   "path": str(tiny_llama)}).raise_for_status()
        yield stack
    finally:
        for process in stack.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in stack.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
