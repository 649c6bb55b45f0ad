"""tokenizer.hash and chat_template.hash: both sides turn text into the same tokens.

Decode renders a chat request again itself; a different template or tokenizer gives a prompt
that differs from what prefill computed (wrong output, or a fallback to recomputing it).
"""

from __future__ import annotations

import hashlib

from console.checks.base import Verdict, check, error
from console.checks.plan import PlanView, describe


def _short(digest: str) -> str:
    return f"{digest[:12]}…" if digest else "none"


@check("tokenizer.hash", "tokenizer files identical on both sides")
def tokenizer_hash(plan: PlanView) -> Verdict:
    if plan.uninspected():
        return Verdict(summary="not compared: a variant is not inspected (see model.path)",
                       skipped=True)
    count, text = describe(plan, lambda w: w.variant.tokenizer_sha256, _short)
    if count == 1:
        return Verdict(summary=text)
    files = _differing_files(plan)
    return Verdict([error(
        f"tokenizers differ: {text}" + (f"; files that differ: {', '.join(files)}" if files else ""),
        "give every variant the base model's tokenizer files (copy them from one variant into "
        "the other's directory), then re-inspect it")], text)


def _differing_files(plan: PlanView) -> list[str]:
    variants = plan.variants()
    names = sorted({name for v in variants for name in v.tokenizer_files})
    return [name for name in names
            if len({v.tokenizer_files.get(name, "") for v in variants}) > 1]


@check("chat_template.hash", "chat template identical on both sides and the router")
def chat_template_hash(plan: PlanView) -> Verdict:
    override = plan.deployment.chat_template
    if override:
        # One file for every worker and the router (console/control/worker_specs.py).
        digest = hashlib.sha256(override.encode()).hexdigest()
        return Verdict(summary=f"the plan's own for every worker and the router: {_short(digest)}")
    if plan.uninspected():
        return Verdict(summary="not compared: a variant is not inspected (see model.path)",
                       skipped=True)
    count, text = describe(plan, lambda w: w.variant.chat_template_sha256, _short)
    # The router renders chats with the tokenizer directory of the first decode worker.
    router = next((w for w in plan.workers if w.role in ("decode", "colocated")), plan.workers[0])
    text += f"; router (as {router.slot})"
    if count == 1:
        return Verdict(summary=text)
    return Verdict([error(
        f"chat templates differ: {text}",
        "copy chat_template.jinja from one variant into the other's directory, then re-inspect "
        "it; or give the plan its own chat template, which every worker and the router use")],
        text)
