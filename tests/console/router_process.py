"""A real router process in front of a deployment's stand-in workers, recorded as its router
in the process table (what the pool sync and the rollout runner ask), for console tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from console.deployments.models import Deployment
from console.gateway.router_admin import admin_token
from console.supervisor.models import ManagedProcess
from tests.console.sockets import wait_for

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def router_process(deployment: Deployment, tokenizer: str, colocated: list[str],
                   log_dir: Path, *flags: str, timeout_s: float = 120) -> Iterator[int]:
    """The router on the plan's router port with ``colocated`` workers, healthy; its pid."""
    argv = [sys.executable, "-m", "inference.router", "--served-model-name", "tiny",
            "--tokenizer", tokenizer, "--max-model-len", "2048",
            "--port", str(deployment.router_port), *flags]
    for url in colocated:
        argv += ["--colocated", url]
    router = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ,
                                   "PDSERVE_ROUTER_ADMIN_TOKEN": admin_token(deployment)})
    ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                  port=deployment.router_port, pid=router.pid,
                                  state=ManagedProcess.State.READY,
                                  log_path=str(log_dir / "router.log"))
    try:
        wait_for(lambda: healthy(f"{deployment.router_url}/health"), "the router",
                 timeout=timeout_s)
        yield router.pid
    finally:
        router.kill()
        router.wait()


def healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
