"""``manage.py supervise``: the supervisor daemon (one per data directory)."""

from __future__ import annotations

import fcntl
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.alerts.delivery import DeliveryWorker
from console.alerts.evaluation import Evaluator
from console.audit.actors import acting_as
from console.autoscaling.runner import Autoscaler
from console.control.daemon import Supervisor
from console.control.kv_storage import KVRootRefused, ensure_kv_root
from console.control.tick_loop import run_ticks
from console.fleet import agent_liveness, secret_fingerprint
from console.gateway.sync import KeySync
from console.supervisor.models import ManagedProcess


class Command(BaseCommand):
    help = ("Own every child process of this node: start, watch and restart the workers and routers "
            "of running deployments, and run the processes gates and Celery tasks ask for.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--status", action="store_true",
                            help="print the process table and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["status"]:
            self._print_status()
            return
        lock_path = Path(settings.DATA_DIR) / "supervisor.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "w")  # noqa: SIM115 - held for the daemon's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise CommandError(f"another supervisor holds {lock_path}") from exc

        self.stopping = False

        def request_stop(signum: int, _frame: FrameType | None) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

        try:
            # The shared-storage KV root: made 0700 now, refused if another user's.
            ensure_kv_root()
        except KVRootRefused as exc:
            raise CommandError(str(exc)) from exc
        if settings.REDIS_URL:
            # For the node agents to check that they derive the same worker keys.
            try:
                secret_fingerprint.publish(agent_liveness.redis_client())
            except redis.RedisError as exc:
                self.stdout.write(f"supervisor: could not publish the secret's fingerprint for "
                                  f"the node agents ({exc}); they will start unchecked")
        supervisor = Supervisor()
        fixed = supervisor.recover()
        if fixed:
            self.stdout.write(f"supervisor: settled {fixed} process record(s) a previous "
                              "supervisor left (running ones of running deployments adopted, "
                              "the rest marked failed)")
        self.stdout.write("supervisor: running", ending="\n")
        self.stdout.flush()
        supervisor.start_log_writer()
        supervisor.start_metrics_collector()
        # Key usage into last_used_at, and key sets re-pushed to routers that missed a change.
        key_sync = KeySync()
        key_sync.start()
        # Alerts: every supervisor runs the evaluator, the lease lets one evaluate at a time;
        # notifications go out from a thread of their own, so a hung receiver delays no tick.
        evaluator, deliveries = Evaluator(interval_s=settings.PDSERVE_ALERT_TICK_S), DeliveryWorker()
        evaluator.start()
        deliveries.start()
        # Autoscaling: decisions change plans; the ticks below start and stop the workers.
        autoscaler = Autoscaler()
        autoscaler.start()
        try:
            # What the daemon changes is the system's doing in the audit log, not a command's.
            with acting_as("system", "supervise"):
                run_ticks(supervisor.tick, lambda: self.stopping,
                          settings.PDSERVE_SUPERVISOR_TICK_S, settings.PDSERVE_SUPERVISOR_DB_GRACE_S)
        finally:
            self.stdout.write("supervisor: stopping all processes")
            supervisor.stop_all()
            supervisor.stop_log_writer()
            supervisor.stop_metrics_collector()
            key_sync.stop()
            evaluator.stop()
            deliveries.stop()
            autoscaler.stop()
            self.stdout.write("supervisor: stopped")
            lock.close()

    def _print_status(self) -> None:
        rows = ManagedProcess.objects.select_related("deployment")
        if not rows:
            self.stdout.write("no processes")
        for row in rows:
            self.stdout.write(
                f"{row.owner_name:20} {row.slot:20} {row.state:9} pid={row.pid or '-':<7} "
                f"port={row.port or '-'} restarts={row.restarts} {row.last_error[:80]}"
            )
