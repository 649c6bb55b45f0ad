"""The supervisor's part of the output gate: run queued gates once a deployment's workers are
ready, each in a thread of its own (a reference vLLM server takes a minute or two to start, and
the supervisor's tick must not wait for it). The reference server is a requested row of the
process table, spawned and stopped by the supervisor's engine like every other process."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.db import connection
from django.utils import timezone

from console.deployments.models import Deployment
from console.quality import services
from console.quality.models import GateResult
from console.quality.servers import served
from console.supervisor.models import ManagedProcess
from console.supervisor.process_requests import ProcessFailed
from console.supervisor.worker_keys import deployment_worker_key, process_key
from inference.launch import LaunchError
from inference.output_gate import (
    DEFAULT_MAX_TOKENS,
    REQUEST_TIMEOUT_S,
    GateError,
    ReferenceServer,
    Thresholds,
    load_prompts,
    reference_answers,
    run_gate,
)
from inference.reference_cache import ReferenceAnswers
from inference.worker_auth import WorkerKeys

log = logging.getLogger("pdserve.quality")
State = GateResult.State


@dataclass
class GateRunner:
    log_dir: Path = field(default_factory=lambda: Path(settings.PDSERVE_LOG_DIR))
    jobs: dict[int, threading.Thread] = field(default_factory=dict)
    # Set when the supervisor stops: a gate cut short by that is queued again, not judged.
    stopping: threading.Event = field(default_factory=threading.Event)

    def recover(self) -> int:
        """Gates a previous supervisor left running will never finish: queue them again. (Their
        reference servers are rows of the process table, which the engine's recover killed.)"""
        return GateResult.objects.filter(state=State.RUNNING).update(state=State.QUEUED,
                                                                      started_at=None)

    def step(self) -> bool:
        """Start the queued gates whose workers are all ready; forget finished threads."""
        did = False
        for gate_id, thread in list(self.jobs.items()):
            if not thread.is_alive():
                del self.jobs[gate_id]
                did = True
        queued = GateResult.objects.filter(
            state=State.QUEUED, deployment__desired_state=Deployment.DesiredState.RUNNING
        ).select_related("deployment")
        for gate in queued:
            if self.stopping.is_set() or gate.pk in self.jobs or not workers_ready(gate.deployment):
                continue
            GateResult.objects.filter(pk=gate.pk).update(state=State.RUNNING,
                                                         started_at=timezone.now())
            thread = threading.Thread(target=self._run, args=(gate.pk,), name=f"gate-{gate.pk}",
                                      daemon=True)
            self.jobs[gate.pk] = thread
            thread.start()
            did = True
        return did

    def stop(self) -> None:
        """The supervisor is stopping: start no gate, and queue again the ones it cuts short."""
        self.stopping.set()

    def stop_all(self, timeout_s: float = 15.0) -> None:
        """Wait for the gate threads, ``timeout_s`` for all of them together: the engine has
        stopped their reference servers by then, so each thread's next request fails at once."""
        self.stop()
        deadline = time.monotonic() + timeout_s
        for thread in self.jobs.values():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.jobs.clear()

    def _run(self, gate_id: int) -> None:
        try:
            gate = GateResult.objects.select_related("deployment__base_model").get(pk=gate_id)
            state, report, error, reference = self._evaluate(gate)
            if self.stopping.is_set() and state == State.ERROR:
                self._queue_again(gate_id)
                return
            GateResult.objects.filter(pk=gate_id).update(
                state=state, report=report, error=error[:1000], reference=reference,
                finished_at=timezone.now())
            log.info("gate #%d of %s: %s %s", gate_id, gate.deployment.name, state, error)
        except Exception:  # the row must not stay "running" whatever happened
            if self.stopping.is_set():
                self._queue_again(gate_id)
                return
            log.exception("gate #%d crashed", gate_id)
            GateResult.objects.filter(pk=gate_id).update(
                state=State.ERROR, error="the gate crashed; see the supervisor's log",
                finished_at=timezone.now())
        finally:
            connection.close()

    def _queue_again(self, gate_id: int) -> None:
        # Cut short by the supervisor's stop, not a verdict: the next supervisor runs it.
        GateResult.objects.filter(pk=gate_id).update(state=State.QUEUED, started_at=None)
        log.info("gate #%d: queued again (the supervisor is stopping)", gate_id)

    def _evaluate(self, gate: GateResult) -> tuple[str, dict[str, Any], str, str]:
        deployment = gate.deployment
        return evaluate(deployment, services.candidates(deployment), gate.prompts,
                        services.thresholds(gate), f"gate-{gate.pk}-reference",
                        self.log_dir / deployment.name / "gate-reference.log", self.stopping)


def evaluate(deployment: Deployment, candidates: dict[str, str], prompt_count: int,
             thresholds: Thresholds, slot: str, log_path: Path,
             stopping: threading.Event) -> tuple[str, dict[str, Any], str, str]:
    """Score ``candidates`` (label -> worker URL) against a reference server of the base model's
    unquantized variant, started for this and released after: (state, report, error,
    reference). A rollout's gate scores green's workers with it (console/control)."""
    variant = services.reference_variant(deployment)
    if variant is None:
        return (State.ERROR, {}, f"{deployment.base_model.name} has no unquantized variant "
                "to use as the reference; register one", "")
    reference = f"{variant} ({deployment.dtype})"
    server = ReferenceServer(model_path=variant.path, port=0, dtype=deployment.dtype,
                             max_model_len=deployment.max_model_len,
                             cache_dir=str(settings.PDSERVE_CACHE_DIR),
                             enforce_eager=settings.PDSERVE_ENFORCE_EAGER)
    # The candidates are the deployment's workers (a rollout's green ones too).
    keys: dict[str, str | None] = {url: deployment_worker_key(deployment.name)
                                   for url in candidates.values()}
    kept = ReferenceAnswers(settings.PDSERVE_CACHE_DIR, variant.path, dtype=deployment.dtype,
                            enforce_eager=settings.PDSERVE_ENFORCE_EAGER,
                            max_tokens=DEFAULT_MAX_TOKENS)
    try:
        prompts = load_prompts(prompt_count)
        answers, how = kept.get(prompts), "kept"
        if answers is None:
            if stopping.is_set():
                raise ProcessFailed("the supervisor is stopping")
            # Released before the scoring: the candidates are scored against its answers.
            with served(server, ManagedProcess.Kind.GATE_REFERENCE, slot, log_path) as process, \
                    httpx.Client(timeout=REQUEST_TIMEOUT_S,
                                 auth=WorkerKeys({process.url: process_key(process)})) as client:
                answers = reference_answers(client, process.url, prompts, DEFAULT_MAX_TOKENS)
            kept.put(prompts, answers)
            how = "live"
        report = run_gate("", candidates, prompts, thresholds=thresholds, answers=answers,
                          keys=keys)
    except (GateError, LaunchError, ProcessFailed, OSError, httpx.HTTPError) as exc:
        return State.ERROR, {}, f"{exc} (reference log: {log_path})", reference
    state = State.PASSED if report.passed else State.FAILED
    return state, {**report.as_dict(), "reference_answers": how}, "", reference


def workers_ready(deployment: Deployment) -> bool:
    slots = {w.slot for w in deployment.workers.all()}
    ready = set(ManagedProcess.objects.filter(
        deployment=deployment, slot__in=slots, state=ManagedProcess.State.READY,
    ).values_list("slot", flat=True))
    return bool(slots) and ready == slots
