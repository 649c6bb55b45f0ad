"""A live console for the fuzzer: uvicorn serving console.asgi on a free port, with its own data
directory and SQLite database (migrated), and a superuser's API token.

No supervise daemon and no Celery worker run beside it, and those are the only parts of pdserve
that start vLLM: a start only records the wanted state, a gate run is a queued row for the
daemon, and a measurement, a quantization job or a weight hash is a Celery message that lands in
the embedded broker's folder under the data directory and stays there. So the operations that
would start vLLM are fuzzed like every other one, nothing is spawned, and what they asked for is
on record: those rows and the broker's messages (``queued_tasks``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.console.sockets import free_port

REPO = Path(__file__).resolve().parents[2]
USERNAME = "fuzzer"
# A throwaway superuser of a throwaway database, on loopback only.
PASSWORD = "fuzz-the-console-api"
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class LiveConsole:
    url: str
    token: str
    data_dir: Path
    log: Path

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers={"Authorization": f"Token {self.token}"},
                         timeout=30)

    def queued_tasks(self) -> Counter[str]:
        """The Celery tasks the console sent, by name: the messages in the broker's folder."""
        names: Counter[str] = Counter()
        for message in (self.data_dir / "celery").rglob("*.msg"):
            names[json.loads(message.read_text())["headers"]["task"]] += 1
        return names


def console_env(data_dir: Path, port: int) -> dict[str, str]:
    env = {**os.environ, "PDSERVE_DATA_DIR": str(data_dir), "PDSERVE_KV_DIR": str(data_dir / "kv"),
           "PDSERVE_CONSOLE_PORT": str(port), "DJANGO_SUPERUSER_USERNAME": USERNAME,
           "DJANGO_SUPERUSER_PASSWORD": PASSWORD, "DJANGO_SUPERUSER_EMAIL": "fuzzer@localhost",
           # The fuzzer's failed sign-ins (random passwords) must not lock out its own.
           "PDSERVE_LOGIN_FAILURE_LIMIT": "1000"}
    # The embedded database and broker, whatever the calling shell points at.
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    return env


def django_shell(console: LiveConsole, code: str) -> str:
    """Run ``code`` in ``manage.py shell`` against the live console's database, as another
    process would write to it; its output."""
    env = console_env(console.data_dir, int(console.url.rsplit(":", 1)[1]))
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@contextmanager
def live_console(root: Path) -> Iterator[LiveConsole]:
    data_dir = root / "data"
    data_dir.mkdir(parents=True)
    port = free_port()
    env = console_env(data_dir, port)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
    subprocess.run([*manage, "createsuperuser", "--noinput"], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    log = root / "console.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        yield LiveConsole(url=url, token=_token(url, server, log), data_dir=data_dir, log=log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _token(url: str, server: subprocess.Popen[bytes], log: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            raise AssertionError(f"the console exited with {server.returncode}: {log.read_text()}")
        try:
            response = httpx.post(f"{url}/api/v1/auth/token/", timeout=5,
                                  json={"username": USERNAME, "password": PASSWORD})
        except httpx.TransportError:
            response = None
        if response is not None:
            assert response.status_code in (200, 201), response.text
            return str(response.json()["token"])
        if time.monotonic() > deadline:
            raise AssertionError(f"the console did not answer within {START_TIMEOUT_S} s: "
                                 f"{log.read_text()}")
        time.sleep(0.5)

