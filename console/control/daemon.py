"""The supervisor: the process engine (console/supervisor/engine.py) driven by the plans of
running deployments, the gates, and the requests of other processes.

Each tick runs a few small steps, each returning whether it did anything: the engine's
``step`` (notice exits, stop requested processes nobody waits for, spawn and release requested
processes, probe: starting -> ready), ``reconcile`` (start what should run, stop what should
not), ``gates`` (output gates once the workers are ready),
``pools`` (a running router's pools follow plan changes, see pools.py), ``housekeeping``
(jobs and measurements whose Celery worker died; the local node's facts) and ``sweep`` (old
shared-storage KV files, and the KV directories of retired revisions: kv_storage.py). A worker
that leaves a running plan is stopped once its router has drained it. Start order: workers,
then the gate, then the router; the router is left out while ``router_hold`` names a reason.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection

from console.control import verify_after_ready
from console.control.kv_storage import ensure_kv_root, remove_unused_revision_dirs
from console.control.pools import PoolSync
from console.control.rollout_runner import RolloutRunner
from console.control.worker_specs import ProcessSpec, kv_channel, process_specs
from console.deployments.models import Deployment
from console.fleet.services import agent_node_ids, refresh_agent_node, refresh_local_node
from console.gateway import gateway_process
from console.gateway.routes_config import gateway_config
from console.live.broadcast import log_messages, send_all
from console.live.collector import MetricsCollector, ScrapeTarget
from console.live.logstore import LogStore
from console.quality.gates import GateRunner
from console.quality.measure import reap_orphans as reap_measurements
from console.quality.services import router_hold
from console.quantization.builder import reap_orphans as reap_builders
from console.supervisor.capture import CapturedLine
from console.supervisor.engine import STOP_GRACE_S, Child, ProcessEngine
from console.supervisor.models import ManagedProcess
from inference.kv_channels import SharedStorageChannel

log = logging.getLogger("pdserve.supervisor")

State = ManagedProcess.State
SWEEP_EVERY_S = 30.0
HOUSEKEEPING_EVERY_S = 5.0


@dataclass
class Supervisor(ProcessEngine):
    last_sweep: float = 0.0
    last_housekeeping: float = 0.0
    prepared: set[int] = field(default_factory=set)
    # The nodes whose agents run their workers (read at each reconcile), for the console's own.
    _agent_nodes: set[int] = field(default_factory=set)
    log_store: LogStore = field(
        default_factory=lambda: LogStore(retention_lines=settings.PDSERVE_LOG_RETENTION_LINES)
    )
    gates: GateRunner = field(default_factory=GateRunner)
    pools: PoolSync = field(default_factory=PoolSync)
    rollouts: RolloutRunner = field(default_factory=RolloutRunner)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._writer_stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._collector: MetricsCollector | None = None

    # ---- start-up ----------------------------------------------------------------------
    def recover(self) -> int:
        """Fix the rows and gates a previous supervisor left alive. Returns how many."""
        fixed = super().recover()
        # A deployment with adopted processes is running, not starting: its KV storage is not
        # emptied under them, and its restart counts go on.
        self.prepared |= {child.deployment_id for child in self.children.values()
                          if child.deployment_id is not None}
        return fixed + self.gates.recover()

    # ---- the loop ----------------------------------------------------------------------
    @property
    def is_agent(self) -> bool:
        """A node agent's supervisor: it runs its node's workers, and nothing of what the
        console's own supervisor runs once for all nodes (gates, pools, rollouts, routers)."""
        return self.node_id is not None

    def runs(self, spec: ProcessSpec) -> bool:
        """Whether ``spec``'s process is this supervisor's to run: on its node."""
        if self.is_agent:
            return spec.node_id == self.node_id
        return spec.node_id is None or spec.node_id not in self._agent_nodes

    def tick(self) -> bool:
        did = self.step()
        did = self.reconcile() or did
        if self.is_agent:
            return self.housekeeping() or did
        did = self.gates.step() or did
        did = self.pools.step() or did
        did = self.rollouts.step(self.children) or did
        did = verify_after_ready.step() or did
        did = self.housekeeping() or did
        return self.sweep() or did

    def housekeeping(self) -> bool:
        """What no GET handler may do: fail the jobs and measurements whose Celery worker died,
        and keep the node's discovered facts fresh."""
        now = time.monotonic()
        if now - self.last_housekeeping < HOUSEKEEPING_EVERY_S:
            return False
        self.last_housekeeping = now
        if self.is_agent:
            refresh_agent_node(self.node_id)
            return False
        reaped = reap_builders() + reap_measurements()
        refresh_local_node()  # rediscovers once its facts are older than the fleet's maximum age
        return reaped > 0

    def reconcile(self) -> bool:
        did = False
        running_slots: set[tuple[int, str]] = set()
        running = list(Deployment.objects.filter(desired_state=Deployment.DesiredState.RUNNING))
        if not self.is_agent:
            self._agent_nodes = agent_node_ids()
        # A deployment's KV storage is emptied once per start, not on every restart of a worker.
        self.prepared &= {d.pk for d in running}
        for deployment in running:
            # A rollout's green workers run beside the plan's, under slots of their own.
            specs = (process_specs(deployment, self.rollouts.held_back(deployment))
                     + self.rollouts.specs(deployment))
            if router_hold(deployment):
                specs = [spec for spec in specs if spec.role != "router"]
            fresh_start = deployment.pk not in self.prepared
            if fresh_start:
                channel = kv_channel(deployment)
                if isinstance(channel, SharedStorageChannel):
                    ensure_kv_root()  # made again, 0700, if it went; refused if another's
                channel.prepare()
                self.prepared.add(deployment.pk)
            for spec in filter(self.runs, specs):
                running_slots.add((deployment.pk, spec.slot))
                if self._child_for(deployment.pk, spec.slot) is not None:
                    continue
                backoff = self.backoff.get((deployment.pk, spec.slot))
                if backoff is not None and time.monotonic() < backoff.retry_at:
                    continue
                self._spawn(deployment, spec, fresh_start=fresh_start)
                did = True
        if not self.is_agent and gateway_process.enabled():
            for replica in gateway_process.replicas():
                running_slots.add((None, gateway_process.slot(replica)))
                did = self._keep_gateway(replica) or did
        for child in list(self.children.values()):
            if child.kind not in ManagedProcess.PLANNED_KINDS:
                continue  # requested processes stop on their requester's word
            if (child.deployment_id, child.slot) not in running_slots and child.stop_deadline is None:
                if child.deployment_id is None or self._drained(child):
                    self.stop(child)
                    did = True
        return did

    def _keep_gateway(self, replica: int) -> bool:
        """Start a gateway replica when it does not run, with the configuration of this moment
        in its file; the key sync keeps it current from then on (console/gateway/sync.py). Each
        replica has a slot of its own, so each is restarted with its own backoff."""
        slot = gateway_process.slot(replica)
        if self._child_for(None, slot) is not None:
            return False
        backoff = self.backoff.get((None, slot))
        if backoff is not None and time.monotonic() < backoff.retry_at:
            return False
        gateway_process.write_config(gateway_config())
        spec = ProcessSpec(slot=slot, role=gateway_process.ROLE,
                           port=gateway_process.port(replica),
                           argv=gateway_process.command(replica),
                           env=gateway_process.environment(), host=gateway_process.host())
        self._spawn(None, spec)
        return True

    def _drained(self, child: Child) -> bool:
        """A worker that left a running plan is stopped only once its router has drained it."""
        record = ManagedProcess.objects.filter(pk=child.record_id).select_related("deployment").first()
        if record is None:
            return True
        return self.pools.drained(record.deployment, record.role, record.url)

    def sweep(self) -> bool:
        now = time.monotonic()
        if now - self.last_sweep < SWEEP_EVERY_S:
            return False
        self.last_sweep = now
        removed = 0
        for deployment in Deployment.objects.filter(kv_channel=SharedStorageChannel.name):
            channel = kv_channel(deployment)
            if isinstance(channel, SharedStorageChannel):
                removed += channel.sweep()
        # Retired revisions' directories, once no worker uses them.
        removed += remove_unused_revision_dirs()
        return removed > 0

    # ---- logs ---------------------------------------------------------------------------
    def flush_logs(self) -> bool:
        """Store the lines captured since the last flush, then broadcast them."""
        batch: list[CapturedLine] = []
        while len(batch) < 5000:
            try:
                batch.append(self.captured.get_nowait())
            except queue.Empty:
                break
        if not batch:
            return False
        rows = self.log_store.write(batch)
        if settings.REDIS_URL:
            # Shared channel layer: the supervisor broadcasts itself, right after storing.
            # Without Redis the console's hub polls the stored rows (console/live/hub.py).
            async_to_sync(send_all)(log_messages(rows))
        return True

    def start_log_writer(self, interval_s: float = 0.1) -> None:
        """Flush captured lines from a thread of their own, so a slow tick never delays logs."""

        def loop() -> None:
            last_prune = time.monotonic()
            try:
                while not self._writer_stop.is_set():
                    try:
                        if not self.flush_logs():
                            self._writer_stop.wait(interval_s)
                        if time.monotonic() - last_prune > 60:
                            self.log_store.prune()
                            last_prune = time.monotonic()
                    except Exception:  # a locked database must not end log capture
                        log.exception("storing log lines failed; retrying")
                        self._writer_stop.wait(1.0)
                while self.flush_logs():
                    pass
            finally:
                connection.close()

        self._writer = threading.Thread(target=loop, name="log-writer", daemon=True)
        self._writer.start()

    def stop_log_writer(self) -> None:
        if self._writer is not None:
            self._writer_stop.set()
            self._writer.join(timeout=10)
            self._writer = None

    # ---- metrics ------------------------------------------------------------------------
    def metric_targets(self) -> list[ScrapeTarget]:
        """The deployments' children that should be answering, for the collector's thread (a
        requested process belongs to no deployment's dashboard)."""
        # A copy: the tick adds and removes children while the collector iterates.
        children = self.children.copy()
        targets = [ScrapeTarget(child.record_id, child.popen.pid) for child in children.values()
                   if child.stop_deadline is None and child.kind in ManagedProcess.PLANNED_KINDS
                   and child.deployment_id is not None]
        if self.is_agent:
            return targets
        # The console's collector scrapes the other nodes' workers too, over the network: a
        # deployment's second is one snapshot of all its processes, wherever they run.
        remote = ManagedProcess.objects.filter(
            node__agent__isnull=False, kind__in=ManagedProcess.PLANNED_KINDS,
            state__in=(State.STARTING, State.READY), pid__isnull=False,
            deployment__desired_state=Deployment.DesiredState.RUNNING,
        ).values_list("pk", "pid", "node__name")
        return targets + [ScrapeTarget(pk, pid, node) for pk, pid, node in remote]

    def start_metrics_collector(self, interval_s: float = 1.0) -> None:
        """Scrape every child's /metrics, CPU and memory once a second, in a thread of its own."""
        self._collector = MetricsCollector(self.metric_targets, interval_s=interval_s)
        self._collector.start()

    def stop_metrics_collector(self) -> None:
        if self._collector is not None:
            self._collector.stop()
            self._collector = None

    # ---- stopping ----------------------------------------------------------------------
    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        # Children first: a gate thread waiting on its reference server then sees it stopped,
        # and queues its gate again for the next supervisor.
        self.gates.stop()
        self.rollouts.stop()
        self.stop_children(grace_s)
        self.gates.stop_all()
        self.http.close()

    # ---- helpers -----------------------------------------------------------------------
    def _child_for(self, deployment_id: int | None, slot: str) -> Child | None:
        for child in self.children.values():
            if child.deployment_id == deployment_id and child.slot == slot:
                return child
        return None

    def _spawn(self, deployment: Deployment | None, spec: ProcessSpec,
               fresh_start: bool = False) -> None:
        """A deployment's worker or router, or with no deployment the gateway."""
        if deployment is None:
            log_path = self.log_dir / f"{spec.slot}.log"  # deployments' logs are directories
            kind = ManagedProcess.Kind.GATEWAY
        else:
            log_path = self.log_dir / deployment.name / f"{spec.slot}.log"
            kind = (ManagedProcess.Kind.ROUTER if spec.role == "router"
                    else ManagedProcess.Kind.WORKER)
        record, created = ManagedProcess.objects.update_or_create(
            deployment=deployment, slot=spec.slot,
            # No env: a router's carries its admin token, and the spec is at hand here anyway.
            defaults={"kind": kind, "role": spec.role, "port": spec.port, "log_path": str(log_path),
                      "env": {}, "node_id": spec.node_id if self.is_agent else None,
                      "host": spec.host},
        )
        # Restarts count within one start of the deployment; a new start begins at 0.
        self.spawn(record, spec.argv, spec.env,
                   restarts=0 if created or fresh_start else record.restarts + 1)
