"""The checks in their one fixed order, run together on a plan into a report."""

from __future__ import annotations

import time
from dataclasses import dataclass

from console.checks import (
    context,
    devices,
    inference_engine,
    kv,
    memory,
    model,
    multimodal,
    nixl,
    nodes,
    parallel,
    ports,
    quant,
    reach,
    sampling,
    tools,
)
from console.checks import tokenizer as tokenizers
from console.checks.base import Check, Outcome, Result, Severity
from console.checks.plan import PlanView
from console.deployments.models import Deployment

CHECKS: tuple[Check, ...] = (
    model.same_base,
    model.path,
    quant.quant_kernel,
    kv.kv_geometry,
    kv.kv_dtype,
    kv.kv_block_size,
    context.context_length,
    tokenizers.tokenizer_hash,
    tokenizers.chat_template_hash,
    multimodal.processor,
    multimodal.limits,
    tools.chat_template_override,
    tools.parsers,
    sampling.sampling_defaults,
    inference_engine.engine_version,
    inference_engine.engine_connector,
    devices.device_conflict,
    parallel.tensor_parallel,
    ports.port_conflict,
    ports.port_bound,
    memory.memory_fit,
    nixl.nixl_compat,
    nodes.node_agent,
    reach.node_reach,
)
CHECK_IDS = tuple(c.id for c in CHECKS)


@dataclass(frozen=True)
class Report:
    outcomes: tuple[Outcome, ...]
    elapsed_ms: float

    @property
    def results(self) -> list[Result]:
        return [r for o in self.outcomes for r in o.results]

    @property
    def errors(self) -> list[Result]:
        return [r for r in self.results if r.severity == Severity.ERROR]

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "results": [r.as_dict() for r in self.results],
            "checks": [o.as_dict() for o in self.outcomes],
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def run_checks(deployment: Deployment) -> Report:
    started = time.perf_counter()
    plan = PlanView.load(deployment)
    if not plan.workers:
        # The plan writers refuse empty pools; a plan edited around them still gets an answer.
        outcome = Outcome("plan.workers", "the plan has workers", (Result(
            "plan.workers", Severity.ERROR, f"{deployment.name} plans no workers",
            "add prefill and decode instances to the plan"),), "", False)
        return Report((outcome,), (time.perf_counter() - started) * 1000)
    outcomes = tuple(c(plan) for c in CHECKS)
    return Report(outcomes, (time.perf_counter() - started) * 1000)


def enforce_handshake_compat(deployment: Deployment) -> bool:
    """For the launch spec: whether NIXL's handshake hash check stays on (see nixl.compat)."""
    return nixl.handshake_compat_enforced(PlanView.workers_only(deployment))
