"""context.length: one context length on both sides, within the model, above the longest request."""

from __future__ import annotations

from console.checks.base import Finding, Verdict, check, error
from console.checks.plan import PlanView, group, who


@check("context.length", "context length equal, within the model, enough for the longest request")
def context_length(plan: PlanView) -> Verdict:
    deployment = plan.deployment
    length = deployment.max_model_len
    findings: list[Finding] = []
    limits = group([w for w in plan.workers if w.variant.max_positions],
                   lambda w: w.variant.max_positions)
    for limit, workers in limits.items():
        if length > limit:
            findings.append(error(
                f"context length {length} exceeds what {who(workers, plan)} "
                f"({workers[0].variant}) allows: {limit} positions; vLLM refuses to start",
                f"lower the context length to {limit} or less, or pick a variant with longer context"))
    if deployment.longest_request > length:
        allowed = min(limits, default=None)
        findings.append(error(
            f"the plan expects requests of up to {deployment.longest_request} tokens but the "
            f"context length is {length}: the router would refuse them with HTTP 400",
            f"raise the context length to at least {deployment.longest_request}"
            + (f" (the model allows {allowed})" if allowed else "")
            + ", or lower the longest expected request"))
    roles = ", ".join(dict.fromkeys(w.role for w in plan.workers))
    model = "; ".join(f"the model allows {limit} on {who(ws, plan)}" for limit, ws in limits.items())
    summary = (f"{length} tokens on {roles} and the router (one plan value); {model}; "
               f"longest expected request {deployment.longest_request}")
    return Verdict(findings, summary)
