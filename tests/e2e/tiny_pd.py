"""Three tiny-model vLLM workers behind the suite's own routers: two prefill and one decode on
shared storage, one core each at most, started as console/control/worker_specs.py starts a plan
with tool options (the hermes parser and the plan's chat template).

prefill-a and decode have auto tool choice; prefill-b does not, which makes it also the worker
that refuses "auto" (tests/e2e/test_tool_calls.py). The failover tests (tests/e2e/test_failover.py)
put two routers in front of all three and kill workers for good at the end; the tool tests put one
in front of prefill-a and decode, and run first (tests/e2e/conftest.py orders them). One start
serves both files, which started three workers each before.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from inference.launch import WorkerSpec, build_command
from tests.console.sockets import free_port
from tests.tiny_llama import TEST_CACHE_DIR

TEMPLATE = Path(__file__).with_name("hermes_tools.jinja")
# name, role, core, auto tool choice
WORKERS = (("prefill-a", "prefill", 0, True), ("prefill-b", "prefill", 1, False),
           ("decode", "decode", 1, True))


@dataclass
class TinyPD:
    model: Path
    logs: Path
    kv_dir: Path
    # Ports from the kernel, never fixed ones: another process holding a fixed port (a
    # benchmark, say) would answer this test's requests in its workers' place.
    ports: dict[str, int] = field(default_factory=lambda: {name: free_port()
                                                           for name, *_ in WORKERS})
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.killpg(self.workers[name].pid, sig)

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A process of the set (a worker or a router), logged to ``logs/<name>.log`` and
        killed by ``close``."""
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        self._processes.append(process)
        return process

    def start_workers(self) -> None:
        for name, role, core, auto_tool_choice in WORKERS:
            argv, env = build_command(WorkerSpec(
                role=role, model_path=str(self.model), served_model_name="tiny",
                port=self.ports[name], max_model_len=2048, kv_channel="shared-storage",
                kv_storage_path=str(self.kv_dir), cpu_cores=(core,), dtype="float32",
                cache_dir=str(TEST_CACHE_DIR), tool_call_parser="hermes",
                enable_auto_tool_choice=auto_tool_choice, chat_template_path=str(TEMPLATE),
                enforce_eager=True,
            ))
            self.workers[name] = self.spawn(name, argv, env)

    def close(self) -> None:
        """Kill every process of the set; safe to call again."""
        processes, self._processes = self._processes, []
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        logs, self._logs = self._logs, []
        for log in logs:
            log.close()
        subprocess.run(["rm", "-rf", str(self.kv_dir)], check=False)
