"""The supervisor's part of the output gate: run queued gates once a deployment's workers are
ready, each in a thread of its own (a reference vLLM server takes a minute or two to start, and
the supervisor's tick must not wait for it). The reference server is a requested row of the
process table, spawned and stopped by the supervisor's engine like every other process."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.deployments.models import Deployment
from console.quality import services
from console.quality.models import GateResult
from console.supervisor.models import ManagedProcess
from console.supervisor.process_requests import ProcessFailed, supervised
from inference.launch import LaunchError
from inference.output_gate import (
    SERVER_START_TIMEOUT_S,
    GateError,
    ReferenceServer,
    free_port,
    load_prompts,
    run_gate,
    server_command,
)

log = logging.getLogger("pdserve.quality")
State = GateResult.State


@dataclass
class GateJob:
    thread: threading.Thread


@dataclass
class GateRunner:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    jobs: dict[int, GateJob] = field(default_factory=dict)

    def recover(self) -> int:
        """Gates a previous supervisor left running will never finish: queue them again. (Their
        reference servers are rows of the process table, which the engine's recover killed.)"""
        return GateResult.objects.filter(state=State.RUNNING).update(state=State.QUEUED,
                                                                      started_at=None)

    def step(self) -> bool:
        """Start the queued gates whose workers are all ready; forget finished threads."""
        did = False
        for gate_id, job in list(self.jobs.items()):
            if not job.thread.is_alive():
                del self.jobs[gate_id]
                did = True
        queued = GateResult.objects.filter(
            state=State.QUEUED, deployment__desired_state=Deployment.DesiredState.RUNNING
        ).select_related("deployment")
        for gate in queued:
            if gate.pk in self.jobs or not workers_ready(gate.deployment):
                continue
            GateResult.objects.filter(pk=gate.pk).update(state=State.RUNNING,
                                                         started_at=timezone.now())
            job = GateJob(threading.Thread(target=self._run, args=(gate.pk,),
                                           name=f"gate-{gate.pk}", daemon=True))
            self.jobs[gate.pk] = job
            job.thread.start()
            did = True
        return did

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """Wait for the gate threads; the engine has stopped their reference servers by then, so
        each thread's next request fails and it records the error."""
        for job in self.jobs.values():
            job.thread.join(timeout=timeout_s)
        self.jobs.clear()

    def _run(self, gate_id: int) -> None:
        try:
            gate = GateResult.objects.select_related("deployment__base_model").get(pk=gate_id)
            state, report, error, reference = self._evaluate(gate)
            GateResult.objects.filter(pk=gate_id).update(
                state=state, report=report, error=error[:1000], reference=reference,
                finished_at=timezone.now())
            log.info("gate #%d of %s: %s %s", gate_id, gate.deployment.name, state, error)
        except Exception:  # the row must not stay "running" whatever happened
            log.exception("gate #%d crashed", gate_id)
            GateResult.objects.filter(pk=gate_id).update(
                state=State.ERROR, error="the gate crashed; see the supervisor's log",
                finished_at=timezone.now())
        finally:
            connection.close()

    def _evaluate(self, gate: GateResult) -> tuple[str, dict, str, str]:
        deployment = gate.deployment
        variant = services.reference_variant(deployment)
        if variant is None:
            return (State.ERROR, {}, f"{deployment.base_model.name} has no unquantized variant "
                    "to use as the reference; register one", "")
        reference = f"{variant} ({deployment.dtype})"
        server = ReferenceServer(model_path=variant.path, port=0, dtype=deployment.dtype,
                                 max_model_len=deployment.max_model_len,
                                 data_dir=str(settings.DATA_DIR))
        log_path = self.log_dir / deployment.name / "gate-reference.log"
        port = free_port()
        argv, env = server_command(server, port)
        try:
            prompts = load_prompts(gate.prompts)
            with supervised(ManagedProcess.Kind.GATE_REFERENCE, f"gate-{gate.pk}-reference", argv,
                            env, log_path, port, SERVER_START_TIMEOUT_S) as process:
                report = run_gate(process.url, services.candidates(deployment), prompts,
                                  thresholds=services.thresholds(gate))
        except (GateError, LaunchError, ProcessFailed, OSError) as exc:
            return State.ERROR, {}, f"{exc} (reference log: {log_path})", reference
        return (State.PASSED if report.passed else State.FAILED, report.as_dict(), "", reference)


def workers_ready(deployment: Deployment) -> bool:
    slots = {w.slot for w in deployment.workers.all()}
    ready = set(ManagedProcess.objects.filter(
        deployment=deployment, slot__in=slots, state=ManagedProcess.State.READY,
    ).values_list("slot", flat=True))
    return bool(slots) and ready == slots
