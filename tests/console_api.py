"""The console's REST API as the heavy suites' stacks call it: a token-authenticated client."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


class ConsoleApi:
    """For a stack (a dataclass) with ``console`` (its base URL) and ``token`` fields."""

    console: str
    token: str

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.console, timeout=60,
                            headers={"Authorization": f"Token {self.token}"})

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self.api() as client:
            return client.request(method, path, **kwargs)


def spawn_console(env: dict[str, str], data_dir: Path, port: int
                  ) -> dict[str, subprocess.Popen[bytes]]:
    """The console's web process (uvicorn on 127.0.0.1:``port``) and its supervisor on ``env``'s
    data directory and database, their output in ``console.log`` and ``supervisor.log``."""
    return {
        "console": subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
             "--port", str(port), "--no-access-log", "--lifespan", "off"], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=open(data_dir / "console.log", "ab")),  # noqa: SIM115
        "supervisor": subprocess.Popen(
            [sys.executable, "manage.py", "supervise"], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=open(data_dir / "supervisor.log", "ab")),  # noqa: SIM115
    }


def admin_token(console: str, password: str, timeout_s: float = 60) -> str:
    """An API token for ``admin``, once the console answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.post(f"{console}/api/v1/auth/token/",
                                  data={"username": "admin", "password": password})
            response.raise_for_status()
            return str(response.json()["token"])
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
