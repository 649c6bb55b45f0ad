"""Symptom 4, output differs from a single-process deployment: the output gate's verdict against
a single server of the base model, decode recomputing prompts, and the pre-flight findings that
make prefill and decode differ (model files, sampling defaults, tokenizer, template, KV dtype)."""

from __future__ import annotations

from console.alerts.symptom_links import OUTPUT_DIFFERS
from console.diagnosis.observations import Observations, PlannedWorker, per_sample
from console.diagnosis.symptoms import (
    Cause,
    Diagnosis,
    Evidence,
    Fix,
    alert_evidence,
    check_evidence,
    judge,
)

WINDOW_S = 300
# The ready-made "PD fallbacks" rule's threshold: decode recomputing more than this share.
FALLBACK_SHARE = 0.05
MODEL_CHECKS = ("model.same_base", "model.path", "quant.kernel", "kv.geometry", "kv.dtype",
                "nixl.compat")
SAMPLING_CHECKS = ("sampling.defaults",)
TEMPLATE_CHECKS = ("tokenizer.hash", "chat_template.hash", "chat_template.override")


def _failed(workers: tuple[PlannedWorker, ...], reasons: tuple[str, ...]
            ) -> tuple[PlannedWorker, ...]:
    """The workers a failed gate's reasons name: each begins with the candidate's label,
    ``<slot> (<variant>)`` (console/quality/services.py) or the bare slot."""
    return tuple(w for w in workers if any(
        reason.startswith((f"{w.slot} (", f"{w.slot}:")) for reason in reasons))


def diagnose(obs: Observations) -> Diagnosis:
    evidence: list[Evidence] = []
    model = sampling = template = quantized = rendering = 0.0
    plan = obs.plan

    gate = obs.gate
    if gate is not None and gate.state == "failed":
        reasons = "; ".join(gate.reasons[:3]) or "below the plan's thresholds"
        evidence.append(Evidence(f"the output gate failed: {reasons}", "gate", gate.finished_at,
                                 gate.url, strong=True))
        # Blame the variants of the workers the gate failed, when its reasons name them: a
        # damaged full-precision decode beside a W8A8 prefill is not a quantization problem.
        failed = _failed(plan.workers, gate.reasons) or plan.workers
        quantized += 2 if any(w.quantized for w in failed) else 0
        model += 1 if any(not w.quantized for w in failed) else 0

    variants = {w.role: (w.variant, w.path) for w in plan.workers}
    if plan.mode == "pd" and len({path for _, path in variants.values()}) > 1:
        described = ", ".join(f"{role} {name}" for role, (name, _) in sorted(variants.items()))
        evidence.append(Evidence(f"prefill and decode serve different model files ({described})",
                                 "plan"))
        model += 1
        quantized += 1 if any(w.quantized for w in plan.workers) else 0

    recent = obs.recent(WINDOW_S)
    fallback = sum(v for _, v in per_sample(recent, "fallback_ps", "router"))
    requests = sum(v for _, v in per_sample(recent, "rps", "router"))
    if fallback and requests and fallback / requests > FALLBACK_SHARE:
        evidence.append(Evidence(f"decode recomputed {fallback / requests:.0%} of prompts in the "
                                 f"last {WINDOW_S // 60} minutes (the router's rendering of the "
                                 "chat differed from prefill's tokens)", "metrics",
                                 recent[-1].at, obs.metrics_url))
        rendering += 2
        template += 1

    for check in obs.checks_of(*MODEL_CHECKS):
        evidence.append(check_evidence(check))
        model += 2 if check.severity == "error" else 1
    for check in obs.checks_of(*SAMPLING_CHECKS):
        evidence.append(check_evidence(check))
        # It names the keys that differ: the most specific account of a difference.
        sampling += 4 if check.severity == "error" else 2
    for check in obs.checks_of(*TEMPLATE_CHECKS):
        evidence.append(check_evidence(check))
        template += 2 if check.severity == "error" else 1

    for alert in obs.alerts_of(OUTPUT_DIFFERS):
        evidence.append(alert_evidence(alert))
        if alert.kind in ("pd_fallback", "router.fallback_ratio"):
            rendering += 1

    causes = [
        Cause("model-files", "prefill and decode do not load the same model files (another "
              "variant, path or KV layout) as the single server did", model, (
                  Fix("serve both roles from the identical model path", "plan:variant"),)),
        Cause("sampling", "the workers' sampling defaults (generation config) differ from each "
              "other or from the single server's", sampling, (
                  Fix("set the same sampling defaults for every worker",
                      "plan:sampling_defaults"),)),
        Cause("quantization", "a quantized variant answers differently from the base model "
              "beyond the gate's thresholds", quantized, (
                  Fix("serve the unquantized variant on the role that drifts, or a better "
                      "calibrated one", "plan:variant"),
                  Fix("or run the gate again after the change", "page:gate"))),
        Cause("template", "the tokenizer or chat template differs, so the same messages become "
              "different prompt tokens", template, (
                  Fix("use one chat template for every worker and the router",
                      "plan:chat_template"),)),
        Cause("prompt-rendering", "decode computes prompts itself because the router's "
              "rendering differs from prefill's tokens (correct, only slower)", rendering, (
                  Fix("send /v1/completions with token ids, or align the chat template",
                      "plan:chat_template"),)),
    ]
    return judge(OUTPUT_DIFFERS, evidence, causes)
