"""The output gate of a rollout's green workers (console/control/rollout_runner.py's gating
state): run in a thread of its own, it scores green's workers against the base model's
reference before any request reaches them, and stores the verdict on the rollout."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from django.conf import settings
from django.db import connection

from console.control.worker_specs import green_workers
from console.deployments.models import Deployment
from console.quality.gates import evaluate
from console.quality.models import GateResult
from console.rollouts.models import Rollout
from inference.output_gate import Thresholds

log = logging.getLogger("pdserve.rollouts")
Strategy = Rollout.Strategy


class GreenGate:
    # The runner's: set when the supervisor stops, which cuts a gate short.
    stopping: threading.Event

    def _gate_wanted(self, rollout: Rollout) -> bool:
        spec = rollout.green.spec
        if spec["gate_mode"] != Deployment.GateMode.AUTO:
            return spec["gate_mode"] == Deployment.GateMode.ON
        # As for a start (console/quality/services.gate_applies), on green's variants.
        shadow = green_workers(rollout.deployment, rollout)
        variants = {w.variant for w in shadow}
        return len(variants) > 1 or any(v.is_quantized for v in variants)

    def _run_gate(self, rollout_id: int) -> None:
        try:
            rollout = Rollout.objects.select_related("deployment__base_model", "to_revision").get(
                pk=rollout_id)
            spec = rollout.green.spec
            candidates: dict[str, str] = {}
            for worker in green_workers(rollout.deployment, rollout):
                if rollout.strategy == Strategy.IN_PLACE and worker.index != rollout.step_index:
                    continue  # in place, each pair is gated as it comes up
                candidates.setdefault(f"{worker.role} {worker.variant.name}", worker.url)
            log_path = (Path(settings.PDSERVE_LOG_DIR) / rollout.deployment.name
                        / f"rollout-{rollout.pk}-gate-reference.log")
            state, report, error, reference = evaluate(
                rollout.deployment, candidates, spec["gate_prompts"],
                Thresholds(min_agreement=spec["gate_min_agreement"],
                           max_mean_delta=spec["gate_max_mean_delta"]),
                f"rollout-{rollout.pk}-gate-reference", log_path, self.stopping)
            if self.stopping.is_set() and state == GateResult.State.ERROR:
                return  # cut short by the supervisor's stop: the next supervisor runs it again
            if (rollout.deployment.gate_action == Deployment.GateAction.WARN
                    and state != GateResult.State.PASSED):
                report = {**report, "warned": True}
                state_for_rollout = GateResult.State.PASSED
            else:
                state_for_rollout = state
            Rollout.objects.filter(pk=rollout_id).update(gate={
                "state": state_for_rollout, "verdict": state, "report": report,
                "error": error[:1000], "reference": reference})
            log.info("rollout #%d: green's gate %s %s", rollout_id, state, error)
        except Exception:  # the rollout must not wait forever on a crashed thread
            log.exception("rollout #%d: the gate crashed", rollout_id)
            Rollout.objects.filter(pk=rollout_id).update(gate={
                "state": GateResult.State.ERROR, "error": "the gate crashed; see the log"})
        finally:
            connection.close()
