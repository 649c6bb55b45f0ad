"""The supervisor's part of the output gate: run queued gates once a deployment's workers are
ready, each in a thread of its own (a reference vLLM server takes a minute or two to start, and
the supervisor's tick must not wait for it)."""

from __future__ import annotations

import logging
import subprocess
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
from console.supervisor.processes import is_same_process, kill_group
from inference.launch import LaunchError
from inference.output_gate import (
    GateError,
    ReferenceServer,
    load_prompts,
    run_gate,
    running_server,
)

log = logging.getLogger("pdserve.quality")
State = GateResult.State


@dataclass
class GateJob:
    thread: threading.Thread
    reference: subprocess.Popen[bytes] | None = None


@dataclass
class GateRunner:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    jobs: dict[int, GateJob] = field(default_factory=dict)

    def recover(self) -> int:
        """Gates a previous supervisor left running will never finish: kill their reference
        servers, still running if that supervisor was killed with SIGKILL (one that stopped
        normally killed them), and queue the gates again."""
        running = GateResult.objects.filter(state=State.RUNNING)
        for gate in running.exclude(reference_pid=None):
            if is_same_process(gate.reference_pid, gate.reference_started_at):
                log.warning("gate #%d: killing the reference server (pid %d) a previous "
                            "supervisor left running", gate.pk, gate.reference_pid)
                kill_group(gate.reference_pid)
        return running.update(state=State.QUEUED, started_at=None, reference_pid=None,
                              reference_started_at=None)

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
        for job in self.jobs.values():
            if job.reference is not None:
                # The thread's next request fails, it records the error and stops the rest.
                kill_group(job.reference.pid)
        for job in self.jobs.values():
            job.thread.join(timeout=timeout_s)
        self.jobs.clear()

    def _run(self, gate_id: int) -> None:
        try:
            gate = GateResult.objects.select_related("deployment__base_model").get(pk=gate_id)
            state, report, error, reference = self._evaluate(gate)
            GateResult.objects.filter(pk=gate_id).update(
                state=state, report=report, error=error[:1000], reference=reference,
                finished_at=timezone.now(), reference_pid=None, reference_started_at=None)
            log.info("gate #%d of %s: %s %s", gate_id, gate.deployment.name, state, error)
        except Exception:  # the row must not stay "running" whatever happened
            log.exception("gate #%d crashed", gate_id)
            GateResult.objects.filter(pk=gate_id).update(
                state=State.ERROR, error="the gate crashed; see the supervisor's log",
                finished_at=timezone.now(), reference_pid=None, reference_started_at=None)
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
        log_path.parent.mkdir(parents=True, exist_ok=True)

        def started(process: subprocess.Popen[bytes]) -> None:
            self.jobs[gate.pk].reference = process
            GateResult.objects.filter(pk=gate.pk).update(reference_pid=process.pid,
                                                         reference_started_at=timezone.now())

        try:
            prompts = load_prompts(gate.prompts)
            with running_server(server, log_path, started=started) as url:
                report = run_gate(url, services.candidates(deployment), prompts,
                                  thresholds=services.thresholds(gate))
        except (GateError, LaunchError, OSError) as exc:
            return State.ERROR, {}, f"{exc} (reference log: {log_path})", reference
        return (State.PASSED if report.passed else State.FAILED, report.as_dict(), "", reference)


def workers_ready(deployment: Deployment) -> bool:
    slots = {w.slot for w in deployment.workers.all()}
    ready = set(ManagedProcess.objects.filter(
        deployment=deployment, slot__in=slots, state=ManagedProcess.State.READY,
    ).values_list("slot", flat=True))
    return bool(slots) and ready == slots
