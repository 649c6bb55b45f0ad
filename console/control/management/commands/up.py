"""``manage.py up``: run the console and the supervisor with the default deployment started.

Ctrl-C or SIGTERM stops the supervisor, which stops every worker and the router. A child that
dies otherwise (the web process, the supervisor, the job worker) is started again: none of them
serves inference, so losing one must not take the deployments down with the others.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.advisor.summary import advice_lines, default_advice, topology_page
from console.audit.actors import acting_as
from console.control import lifecycle
from console.deployments.defaults import DEFAULT_DEPLOYMENT
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.live.start_phase import current_phases
from console.supervisor.models import ManagedProcess

# A child that keeps dying soon after its start waits longer each time (1, 2, 4 ... 30 s), so a
# broken configuration does not spin; one that ran this long counts as having started fine.
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
STABLE_AFTER_S = 60.0


@dataclass
class Child:
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    started: float
    quick_exits: int = 0
    restart_at: float | None = None

    @classmethod
    def spawn(cls, name: str, argv: list[str]) -> Child:
        return cls(name, argv, subprocess.Popen(argv, cwd=settings.BASE_DIR), time.monotonic())

    def respawn(self) -> None:
        self.popen = subprocess.Popen(self.argv, cwd=settings.BASE_DIR)
        self.started = time.monotonic()
        self.restart_at = None

    def alive(self) -> bool:
        return self.popen.poll() is None


class Command(BaseCommand):
    help = "Start the console and the supervisor, and start the default deployment."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-start", action="store_true",
                            help="do not start the default deployment")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("bootstrap", stdout=self.stdout)
        deployment = Deployment.objects.get(name=DEFAULT_DEPLOYMENT)
        if not options["no_start"]:
            self.start(deployment)
        started = time.monotonic()
        host, port = settings.PDSERVE_CONSOLE_HOST, settings.PDSERVE_CONSOLE_PORT
        children = [
            Child.spawn("supervisor", [sys.executable, "manage.py", "supervise"]),
            Child.spawn("console web process", [
                sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", host,
                "--port", str(port), "--no-access-log", "--lifespan", "off"]),
            # Background jobs (variant hashing): the same Celery code path with or without Redis.
            Child.spawn("job worker", [
                sys.executable, "-m", "celery", "-A", "console.celery", "--quiet", "worker",
                "--pool", "solo", "--concurrency", "1", "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]),
        ]
        self.stopping = False

        def request_stop(signum: int, _frame: FrameType | None) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        self.stdout.write(f"pdserve: console on http://{host}:{port}/ ; starting workers "
                          "(a vLLM worker takes 1-2 minutes on a CPU)...")
        announced = options["no_start"]
        seen: dict[str, str] = {}
        try:
            while not self.stopping:
                for child in children:
                    self._restart_if_dead(child)
                self._report_progress(deployment, seen, time.monotonic() - started)
                if not announced and _router_ready(deployment.router_url):
                    announced = True
                    self._announce(deployment, host, port, time.monotonic() - started)
                time.sleep(0.5)
        finally:
            running = [child.popen for child in children if child.alive()]
            for popen in running:
                popen.send_signal(signal.SIGTERM)
            for popen in running:
                try:
                    popen.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    popen.kill()
            self.stdout.write("pdserve: stopped")

    def _restart_if_dead(self, child: Child) -> None:
        if child.alive():
            return
        now = time.monotonic()
        if child.restart_at is None:
            ran = now - child.started
            child.quick_exits = 0 if ran > STABLE_AFTER_S else child.quick_exits + 1
            delay = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2 ** max(child.quick_exits - 1, 0))
            child.restart_at = now + delay
            self.stderr.write(f"pdserve: the {child.name} exited with code "
                              f"{child.popen.returncode} after {ran:.0f} s; starting it again "
                              f"in {delay:.0f} s")
        elif now >= child.restart_at:
            child.respawn()
            self.stdout.write(f"pdserve: the {child.name} started again (pid {child.popen.pid})")

    def start(self, deployment: Deployment) -> None:
        """Start ``deployment``; its audit entry names this command."""
        try:
            with acting_as("command", "up"):
                lifecycle.start(deployment)
        except lifecycle.Refused as refused:
            # The same pre-flight checks as the Start button: say what is wrong and stop.
            for finding in refused.report.errors:
                self.stderr.write(f"pdserve: [{finding.id}] {finding.message}\n"
                                  f"         fix: {finding.hint}")
            raise CommandError(f"{deployment.name}: {refused}") from refused

    def _report_progress(self, deployment: Deployment, seen: dict[str, str], elapsed: float) -> None:
        """Print each process's state, and a starting worker's phase (loading weights,
        compiling, ...), when it changes, so a long start shows where it is."""
        processes = list(ManagedProcess.objects.filter(deployment=deployment))
        phases = current_phases(processes)
        for process in processes:
            phase = phases.get(process.pk)
            state = f"{process.state} ({phase})" if phase else process.state
            if seen.get(process.slot) != state:
                seen[process.slot] = state
                detail = f" ({process.last_error})" if process.last_error else ""
                self.stdout.write(f"pdserve: [{elapsed:5.0f} s] {process.slot}: {state}{detail}")
                self.stdout.flush()

    def _announce(self, deployment: Deployment, host: str, port: int, elapsed: float) -> None:
        auth = ' -H "Authorization: Bearer $PDSERVE_API_KEY"' if settings.PDSERVE_API_KEY else ""
        self.stdout.write(
            f"\npdserve: deployment {deployment.name} is ready after {elapsed:.0f} s\n"
            f"  console: http://{host}:{port}/\n"
            f"  router:  {deployment.router_url}/v1  (OpenAI-compatible)\n"
            + (f"  gateway: {', '.join(f'{url}/v1' for url in gateway_process.urls())}  "
               "(every deployment by its model name)\n"
               if gateway_process.enabled() else "") +
            f"  try:     curl {deployment.router_url}/v1/chat/completions{auth} "
            f"-H 'Content-Type: application/json' -d '{{\"model\":\"{deployment.served_model_name}\","
            f"\"messages\":[{{\"role\":\"user\",\"content\":\"What is the capital of France?\"}}]}}'\n"
            "  stop:    Ctrl-C\n"
        )
        # What the topology advisor makes of this machine (once its speeds are measured): the
        # default deployment is 1P1D to show what pdserve does, not because it is always best.
        self.stdout.write("\npdserve: " + "\n".join(advice_lines(
            deployment, default_advice(deployment), topology_page(deployment))) + "\n")
        self.stdout.flush()


def _router_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False
