"""One running tiny-model deployment per test session, lent to one borrower at a time.

The first ``borrow()`` starts it (a run that never borrows pays nothing): a console of its own
(``manage.py up --no-start``: console, supervisor and job worker on a data directory of their own,
SQLite), a random-weight tiny Llama (tests/tiny_llama.py) registered through the REST API, and a
1-prefill/1-decode plan of it with the router, on ports from the kernel, started through the API
and waited to ready. Later borrowers find it running: they add test minutes, not vLLM start-ups.

A borrower may change the plan, stop the deployment or kill its processes. When it gives the
deployment back, the original plan is restored (stop, save, start) if it changed, the deployment
is started if it was stopped, and the return waits until it is clean: every planned process ready
and alive, the router healthy and a completion answered. If that cannot be reached the borrower's
test fails, with the processes' errors and log tails, and so does every later borrow. Two
exceptions, each saving two vLLM starts: a plan that is the original on other worker ports (a
rollback's green) is kept as it is, and the session's last borrower does not put it back at all
(it is stopped right after; tests/conftest.py).

What "clean" does not cover: restart counts, metrics counters, logs and API keys a borrower added,
and the stopped process rows of slots a borrower added and removed (the process table's history).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.borrowed_clean import BorrowError, alive, tail, wait_clean
from tests.borrowed_plan import current_processes, plan_body, plan_of, without_ports
from tests.console.sockets import free_port
from tests.console_api import ConsoleApi
from tests.tiny_llama import shared_tiny_llama
from tests.worker_key import worker_headers

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR",
                              REPO / "data" / "models" / "smollm2-135m-instruct"))
ADMIN_PASSWORD = "borrowed-admin-password"
NAME = "borrowed-tiny"
SERVED_MODEL_NAME = "tiny"
STARTER_SECRETS = {"EMAIL_HOST_PASSWORD": "poison-mail-password", "HF_TOKEN": "poison-hf-token"}
START_TIMEOUT_S = 420.0

# Borrowers take turns: the deployment is lent to one at a time.
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Handle(ConsoleApi):
    """What a borrower gets: where the deployment is and how to talk to it."""

    console: str
    token: str
    deployment_id: int
    router: str
    served_model_name: str
    data_dir: Path
    # The console's gateway: one endpoint for the borrowed deployment and any a borrower adds.
    gateway: str = ""

    def deployment(self) -> dict[str, Any]:
        response = self.call("GET", f"/api/v1/deployments/{self.deployment_id}/")
        response.raise_for_status()
        return response.json()

    def worker_headers(self) -> dict[str, str]:
        """What its workers want of a caller: the deployment's key (inference/worker_auth.py)."""
        return worker_headers(self.data_dir, NAME)

    def processes(self) -> dict[str, dict[str, Any]]:
        """The deployment's processes by slot: prefill-0, decode-0, router (and any other
        planned or still running; see ``current_processes``)."""
        return current_processes(self.deployment())

    def wait_for_state(self, wanted: str, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            body = self.deployment()
            if body["state"] == wanted:
                return body
            time.sleep(1)
        raise AssertionError(f"deployment not {wanted} after {timeout_s} s: {body}")

    def complete(self, prompt: str = "The capital of France is", max_tokens: int = 4,
                 **body: Any) -> httpx.Response:
        """A completion through the router (random weights: the text means nothing)."""
        return httpx.post(f"{self.router}/v1/completions", timeout=120, json={
            "model": self.served_model_name, "prompt": prompt, "max_tokens": max_tokens, **body})

    def log(self, slot: str) -> Path:
        return self.data_dir / "logs" / NAME / f"{slot}.log"


class BorrowedDeployment:
    """The facility: started on first use, lent serially, stopped by :meth:`close`."""

    def __init__(self) -> None:
        self.handle: Handle | None = None
        self.start_seconds: float | None = None
        self._up: subprocess.Popen[bytes] | None = None
        self._up_log: Any = None
        self._model: Path | None = None
        self._plan: dict[str, Any] = {}
        self._broken = ""
        self._holder: int | None = None  # the thread it is lent to

    # ---- lending -----------------------------------------------------------------------
    @contextmanager
    def borrow(self, root: Path | None = None, put_back: bool = True) -> Iterator[Handle]:
        """Lend the deployment (starting it the first time, under ``root`` or a temporary
        directory); on return, put it back clean or fail. ``put_back=False`` is only for the
        session's last borrower: the early teardown closes the deployment right after it
        (tests/early_teardown.py), and a borrow after that starts a new one."""
        if self._holder == threading.get_ident():
            raise BorrowError("the borrowed deployment is already lent to this thread (a nested borrow)")
        if not _LOCK.acquire(timeout=START_TIMEOUT_S):
            raise BorrowError(f"the borrowed deployment was not given back within {START_TIMEOUT_S:.0f} s")
        self._holder = threading.get_ident()
        try:
            if self._broken:
                raise BorrowError(f"the borrowed deployment is broken: {self._broken}")
            handle = self.handle or self._start(root)
            try:
                yield handle
            finally:
                if put_back:
                    self._put_back(handle)
        finally:
            self._holder = None
            _LOCK.release()

    @property
    def plan(self) -> dict[str, Any]:
        """The plan as first started (``plan_of`` a deployment reading), which put-back restores."""
        return dict(self._plan)

    def pids(self) -> set[int]:
        """Every process of the facility (console, supervisor, workers, router); empty before
        the first borrow and after :meth:`close`."""
        if self._up is None or self._up.poll() is not None:
            return set()
        try:
            up = psutil.Process(self._up.pid)
            found = {up.pid, *(child.pid for child in up.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()
        # Processes a next supervisor adopted (after a supervisor was killed) are no longer
        # under `up`: the process table names them.
        return found | self._recorded_trees()

    def _recorded_trees(self) -> set[int]:
        """The deployment's processes as the console records them, each with its children."""
        if self.handle is None:
            return set()
        found: set[int] = set()
        for process in self.handle.processes().values():
            if not process["pid"]:
                continue
            try:
                leader = psutil.Process(process["pid"])
                found |= {leader.pid, *(child.pid for child in leader.children(recursive=True))}
            except psutil.NoSuchProcess:
                continue
        return found

    # ---- start -------------------------------------------------------------------------
    def _start(self, root: Path | None) -> Handle:
        started = time.monotonic()
        root = root or Path(tempfile.mkdtemp(prefix="pdserve-borrowed-"))
        root.mkdir(parents=True, exist_ok=True)
        try:
            handle = self._create_and_start(self._start_console(root))
        except BaseException as exc:
            self._broken = f"it did not start: {exc}"
            self.close()
            raise
        self.handle = handle
        self.start_seconds = time.monotonic() - started
        return handle

    def _start_console(self, root: Path) -> Handle:
        if not (SMOLLM2 / "tokenizer.json").is_file():
            subprocess.run([sys.executable, "-m", "inference.prepare_model", "--out", str(SMOLLM2)],
                           cwd=REPO, check=True)
        self._model = shared_tiny_llama(SMOLLM2)
        data_dir = root / "data"
        port, gateway_port = free_port(), free_port()
        env = {**os.environ, "PDSERVE_DATA_DIR": str(data_dir), "PDSERVE_KV_DIR": str(data_dir / "kv"),
               "PDSERVE_ADMIN_USER": "admin", "PDSERVE_ADMIN_PASSWORD": ADMIN_PASSWORD,
               "PDSERVE_CONSOLE_PORT": str(port), "PDSERVE_ROUTER_PORT": str(free_port()),
               "PDSERVE_GATEWAY_PORT": str(gateway_port),
               # A short gateway queue: tests/e2e/test_gateway_live.py's flood fills it with a
               # few dozen clients instead of a hundred.
               "PDSERVE_GATEWAY_MAX_QUEUE": "8",
               # tests/e2e/test_alerts_live.py's webhook receiver listens on 127.0.0.1.
               "PDSERVE_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
               # Secrets of the starter that no worker may read (tests/e2e/test_worker_key.py);
               # nothing here sends mail or reaches a hub.
               **STARTER_SECRETS}
        for name in ("DATABASE_URL", "REDIS_URL"):
            env.pop(name, None)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
        # `up` bootstraps the default plan too; it is never started here.
        subprocess.run([*manage, "bootstrap", "--model-dir", str(SMOLLM2)], cwd=REPO, env=env,
                       check=True, stdout=subprocess.DEVNULL)
        self._up_log = open(root / "up.log", "wb")  # noqa: SIM115 - closed in close()
        self._up = subprocess.Popen([*manage, "up", "--no-start"], cwd=REPO, env=env,
                                    stdout=self._up_log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        atexit.register(self.close)
        console = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            if self._up.poll() is not None:
                raise BorrowError(f"manage.py up exited with {self._up.returncode}: "
                                  f"{tail(root / 'up.log')}")
            try:
                response = httpx.post(f"{console}/api/v1/auth/token/", timeout=5, data={
                    "username": "admin", "password": ADMIN_PASSWORD})
                token = response.json()["token"]
                break
            except (httpx.TransportError, ValueError, KeyError):
                if time.monotonic() > deadline:
                    raise BorrowError(f"the console did not answer: {tail(root / 'up.log')}") from None
                time.sleep(0.5)
        return Handle(console=console, token=token, deployment_id=0, router="",
                      served_model_name=SERVED_MODEL_NAME, data_dir=data_dir,
                      gateway=f"http://127.0.0.1:{gateway_port}")

    def _create_and_start(self, console: Handle) -> Handle:
        """Register the tiny model with ``console`` (a handle without a deployment yet), plan
        it, start it and wait until it is clean."""
        _expect(console.call("POST", "/api/v1/models/", json={"name": "tiny"}), 201)
        _expect(console.call("POST", "/api/v1/variants/", json={
            "base_model": "tiny", "name": "f32", "path": str(self._model)}), 201)
        created = _expect(console.call("POST", "/api/v1/deployments/", json={
            "name": NAME, "base_model": "tiny", "served_model_name": SERVED_MODEL_NAME,
            "max_model_len": 2048, "longest_request": 2048, "kv_cache_gib": 1,
            "dtype": "float32", "kv_channel": "shared-storage",
            "sampling_defaults": {"temperature": 0},
            # Ports from the kernel: clear of the fixed ones other suites' deployments use.
            "prefill": {"variant": "tiny/f32", "instances": [
                {"cpu_cores": "0", "port": free_port(), "side_channel_port": free_port()}]},
            "decode": {"variant": "tiny/f32", "instances": [
                {"cpu_cores": "1", "port": free_port(), "side_channel_port": free_port()}]},
            "router": {"port": free_port()},
        }), 201)
        if not created["checks"]["ok"]:
            raise BorrowError(f"the plan's checks failed: {created['checks']}")
        handle = replace(console, deployment_id=created["id"], router=created["router_url"])
        _expect(handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/start"), 202)
        wait_clean(handle, "starting it", START_TIMEOUT_S)
        self._plan = plan_of(handle.deployment())
        return handle

    # ---- put back ----------------------------------------------------------------------
    def _put_back(self, handle: Handle) -> None:
        try:
            body = handle.deployment()
            now = plan_of(body)
            if without_ports(now) == without_ports(self._plan):
                # A blue-green rollout back to the same revision (a rollback) leaves the plan as
                # it was on green's ports: the same deployment, and restoring blue's ports would
                # cost two vLLM starts. The plan as put back is now this one.
                self._plan = now
            if now != self._plan:
                changed = sorted(k for k in {*now, *self._plan} if now.get(k) != self._plan.get(k))
                print(f"borrowed: the plan changed ({', '.join(changed)}): restarting it",
                      file=sys.stderr)
                self._stop(handle)
                _expect(handle.call("PUT", f"/api/v1/deployments/{handle.deployment_id}/",
                                    json=plan_body(self._plan)), 200)
                body = handle.deployment()
                if plan_of(body) != self._plan:
                    raise BorrowError(f"the original plan did not come back: {plan_of(body)}")
            if body["desired_state"] != "running":
                if body["state"] != "stopped":
                    handle.wait_for_state("stopped", timeout_s=90)
                _expect(handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/start"), 202)
            wait_clean(handle, "putting it back", START_TIMEOUT_S)
        except BaseException as exc:
            self._broken = f"it was not put back clean: {exc}"
            raise

    def _stop(self, handle: Handle) -> None:
        if handle.deployment()["desired_state"] == "running":
            _expect(handle.call("POST", f"/api/v1/deployments/{handle.deployment_id}/stop"), 202)
        handle.wait_for_state("stopped", timeout_s=90)

    # ---- the end -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop everything (the supervisor stops the workers and the router)."""
        family: set[int] = set()
        try:
            family = self._recorded_trees()
        except httpx.HTTPError:
            pass  # the console is gone: `up`'s own tree below is all that can be found
        up, self._up = self._up, None
        self.handle = None
        if up is None:
            return
        try:
            family |= {child.pid for child in psutil.Process(up.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        for pid in family:
            if alive(pid):  # only after `up` itself had to be killed
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._up_log is not None:
            self._up_log.close()


def _expect(response: httpx.Response, status: int) -> dict[str, Any]:
    if response.status_code != status:
        raise BorrowError(f"{response.request.method} {response.request.url}: "
                          f"{response.status_code}, expected {status}: {response.text[:2000]}")
    return response.json()


# The session's one deployment.
FACILITY = BorrowedDeployment()


def borrow(root: Path | None = None, put_back: bool = True) -> AbstractContextManager[Handle]:
    """``with borrow() as handle:`` the session's tiny-model deployment, put back clean after
    (``put_back=False``: not at all, for the session's last borrower)."""
    return FACILITY.borrow(root, put_back)


def shutdown() -> None:
    FACILITY.close()
