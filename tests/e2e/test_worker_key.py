"""A real (tiny) vLLM worker refuses callers without its key on every path but /health, and
reads none of its starter's secrets in its environment (inference/worker_auth.py,
inference/child_env.py)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from inference.child_env import child_environment
from inference.launch import WorkerSpec, build_command
from inference.output_gate import free_port
from inference.process_groups import stop_group
from tests.borrowed import SMOLLM2
from tests.tiny_llama import build_tiny_llama

KEY = "worker-key-" + "7" * 40
SECRETS = {"PDSERVE_SECRET_KEY": "poison-secret-key", "DATABASE_URL": "postgres://u:poison@h/d",
           "REDIS_URL": "redis://:poison@h/0", "EMAIL_HOST_PASSWORD": "poison-mail",
           "HF_TOKEN": "poison-hf"}


@dataclass
class Worker:
    url: str
    pid: int


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    data = tmp_path_factory.mktemp("worker-key")
    model = build_tiny_llama(SMOLLM2, data / "tiny", layers=2, dtype="float32")
    port = free_port()
    argv, env = build_command(WorkerSpec(
        role="colocated", model_path=str(model), served_model_name="tiny", port=port,
        max_model_len=512, dtype="float32", cache_dir=str(data / "cache"), enforce_eager=True))
    parent = {**os.environ, **SECRETS}
    log = open(data / "worker.log", "ab")  # noqa: SIM115 - closed below
    process = subprocess.Popen(argv, env=child_environment({**env, "VLLM_API_KEY": KEY}, parent),
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while True:
            assert process.poll() is None, (data / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker was not healthy in 400 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield Worker(url, process.pid)
    finally:
        stop_group(process)
        log.close()


CALLS = [("POST", "/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 2}),
         ("POST", "/v1/chat/completions",
          {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
         ("GET", "/v1/models", None),
         ("POST", "/tokenize", {"model": "tiny", "prompt": "Hello"}),
         ("POST", "/detokenize", {"model": "tiny", "tokens": [1, 2]}),
         ("GET", "/metrics", None),
         ("GET", "/version", None)]


@pytest.mark.parametrize(("method", "path", "body"), CALLS, ids=[c[1] for c in CALLS])
def test_without_its_key_a_worker_answers_401_and_with_it_200(
        worker: Worker, method: str, path: str, body: dict[str, object] | None) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {KEY}x"}):
        refused = httpx.request(method, f"{worker.url}{path}", json=body, headers=headers,
                                timeout=60)
        assert refused.status_code == 401, (path, headers, refused.text)
    answered = httpx.request(method, f"{worker.url}{path}", json=body, timeout=60,
                             headers={"Authorization": f"Bearer {KEY}"})
    assert answered.status_code == 200, (path, answered.text)


def test_health_needs_no_key(worker: Worker) -> None:
    assert httpx.get(f"{worker.url}/health", timeout=10).status_code == 200


def test_the_worker_and_its_engine_read_none_of_the_starters_secrets(worker: Worker) -> None:
    tree = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    assert len(tree) >= 2  # the API server and its engine core
    for process in tree:
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().decode(errors="replace")
        assert not [v for v in SECRETS.values() if v in environ], process.name()
        assert KEY not in " ".join(process.cmdline())
