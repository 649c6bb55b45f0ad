"""One real stack per test session: the console, the supervisor, the default deployment's two
vLLM workers and the router.

The single server that PD's output is compared with is the deployment's own prefill worker,
asked directly for the whole answer: a plain vLLM server of the same model, dtype and sampling
defaults (its KV connector only saves what it computes). A separate reference server cost a
third SmolLM2 start and 3 GB beside the pair.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests import early_teardown
from tests.console.sockets import free_port
from tests.console_api import ConsoleApi
from tests.e2e.tiny_pd import TinyPD
from tests.tiny_llama import shared_tiny_llama
from tests.worker_key import worker_headers

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get(
    "PDSERVE_TEST_MODEL_DIR", REPO / "data" / "models" / "smollm2-135m-instruct"
))
ADMIN_PASSWORD = "e2e-admin-password"
START_TIMEOUT_S = 420


@dataclass
class Stack(ConsoleApi):
    console: str
    token: str
    deployment_id: int
    router: str
    data_dir: Path
    # The single server: the prefill worker, with its deployment's key (tests/worker_key.py).
    reference: str = ""
    reference_headers: dict[str, str] = field(default_factory=dict)

    def deployment(self) -> dict:
        with self.api() as client:
            response = client.get(f"/api/v1/deployments/{self.deployment_id}/")
            response.raise_for_status()
            return response.json()

    def wait_for_state(self, wanted: str, timeout_s: float = START_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        body: dict = {}
        while time.monotonic() < deadline:
            body = self.deployment()
            if body["state"] == wanted:
                return body
            time.sleep(1)
        raise AssertionError(f"deployment not {wanted} after {timeout_s} s: {body}")


def _wait_http(url: str, timeout_s: float,
               process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait for ``url`` to answer. With ``process``, the one meant to answer: if it exits
    first, fail at once rather than wait, or talk to whatever else holds the port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{url}: the process meant to answer exited with "
                                 f"{process.returncode} first (see its log)")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The borrowed deployment's tests, then the stack's, then the tiny workers' (the tool
    # tests before the failover tests, which kill workers for good), then the files that start
    # their own servers: each set is closed after its last user (tests/early_teardown.py).
    # The advisor's test is the borrowed deployment's last: it rolls the deployment out to
    # colocated, and the last borrower's changes are not undone (tests/conftest.py).
    early_teardown.order_by_set(items, "e2e", ["borrowed", "stack", "tools", "tiny_pd"],
                                last_files=("test_advisor_live.py",))


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, check=True)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    if not (MODEL_DIR / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "inference.prepare_model", "--out", str(MODEL_DIR)],
                       cwd=REPO, check=True)
    return MODEL_DIR


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("pdserve-data")
    console_port = free_port()
    env = {
        **os.environ,
        "PDSERVE_DATA_DIR": str(data_dir),
        "PDSERVE_KV_DIR": str(data_dir / "kv"),
        "PDSERVE_ADMIN_USER": "admin",
        "PDSERVE_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "PDSERVE_CONSOLE_PORT": str(console_port),
    }
    env.pop("DATABASE_URL", None)
    _manage(env, "migrate", "--noinput", "-v", "0")
    _manage(env, "bootstrap", "--model-dir", str(model_dir))

    console = subprocess.Popen([sys.executable, "manage.py", "up", "--no-start"], cwd=REPO,
                               env=env)

    def close() -> None:
        """Stop the console (its supervisor stops the deployment); the last test that uses the
        stack calls this (tests/early_teardown.py), and the end of the session again."""
        if console.poll() is None:
            console.send_signal(signal.SIGTERM)
            try:
                console.wait(timeout=60)
            except subprocess.TimeoutExpired:
                console.kill()
                console.wait()

    early_teardown.register("stack", "tests/e2e", close)
    try:
        console_url = f"http://127.0.0.1:{console_port}"
        _wait_http(f"{console_url}/login/", 60, console)
        token = httpx.post(f"{console_url}/api/v1/auth/token/",
                           data={"username": "admin", "password": ADMIN_PASSWORD}).json()["token"]
        deployments = httpx.get(f"{console_url}/api/v1/deployments/",
                                headers={"Authorization": f"Token {token}"}).json()["results"]
        default = next(d for d in deployments if d["name"] == "smollm2-1p1d")
        stack = Stack(console=console_url, token=token, deployment_id=default["id"],
                      router=default["router_url"], data_dir=data_dir)
        with stack.api() as client:
            client.post(f"/api/v1/deployments/{stack.deployment_id}/start").raise_for_status()
        body = stack.wait_for_state("ready")
        [prefill] = [p for p in body["processes"] if p["slot"] == "prefill-0"]
        stack.reference = f"http://127.0.0.1:{prefill['port']}"
        stack.reference_headers = worker_headers(data_dir, default["name"])
        yield stack
    finally:
        close()


@pytest.fixture(scope="session")
def tiny_pd(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyPD]:
    """Two tiny prefill workers and a decode (tests/e2e/tiny_pd.py), for the tool-call and the
    failover tests."""
    workers = TinyPD(model=shared_tiny_llama(model_dir), logs=tmp_path_factory.mktemp("tiny-pd"),
                     kv_dir=Path("/dev/shm") / f"pdserve-tiny-pd-{os.getpid()}")
    early_teardown.register("tiny_pd", "tests/e2e", workers.close)
    try:
        workers.start_workers()
        for name, process in workers.workers.items():
            _wait_http(f"{workers.url(name)}/health", START_TIMEOUT_S, process)
        yield workers
    finally:
        workers.close()
