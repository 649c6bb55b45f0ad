"""nixl.compat: the NIXL handshake of prefill and decode will succeed.

vLLM's NIXL compatibility hash covers the vLLM version, the model path string, dtype, KV heads,
head size, layers, attention backend and KV cache dtype. Two variants of one model have
different paths, so their handshake fails unless decode sets ``enforce_handshake_compat:
false``; pdserve does that only when kv.geometry and kv.dtype show the caches really match.
"""

from __future__ import annotations

from console.checks.base import Verdict, check, error, warning
from console.checks.kv import dtypes, geometry
from console.checks.plan import PlanView, describe, group, who
from inference.kv_channels import NixlChannel


def _applies(plan: PlanView) -> bool:
    return plan.is_pd and plan.deployment.kv_channel == NixlChannel.name


def _caches_match(plan: PlanView) -> bool:
    return not plan.uninspected() and geometry(plan)[0] == 1 and dtypes(plan)[0] == 1


def handshake_compat_enforced(plan: PlanView) -> bool:
    """False only where the check below switches NIXL's handshake hash check off."""
    if not _applies(plan) or len({w.variant.path for w in plan.workers}) == 1:
        return True
    return not (_caches_match(plan) and len({plan.device_kind(w) for w in plan.workers}) == 1)


@check("nixl.compat", "NIXL handshake compatible (model path, devices, KV layout)")
def nixl_compat(plan: PlanView) -> Verdict:
    if not _applies(plan):
        return Verdict(summary=f"not used: the channel is {plan.deployment.kv_channel}"
                       if plan.is_pd else "not used: colocated")
    findings = []
    kinds, kind_text = describe(plan, plan.device_kind, where=lambda ws: ws[0].node.name)
    if kinds > 1:
        findings.append(error(
            f"prefill and decode run on different devices ({kind_text}): the attention backend, "
            "part of NIXL's compatibility hash, and the KV layout differ",
            "run prefill and decode on the same kind of device"))
        return Verdict(findings, kind_text)
    paths = group(plan.workers, lambda w: w.variant.path)
    if len(paths) == 1:
        return Verdict(findings, f"one model path on every worker ({next(iter(paths))}): the "
                                 "handshake hash matches")
    sides = "; ".join(f"{who(ws, plan)} reads {path} ({ws[0].variant})" for path, ws in paths.items())
    if _caches_match(plan):
        findings.append(warning(
            f"prefill and decode use different variants ({sides}). NIXL's compatibility hash "
            "includes the model path, so the handshake would fail; pdserve switches "
            "enforce_handshake_compat off on the workers, because kv.geometry and kv.dtype passed",
            "nothing to do; use one variant on both sides to keep vLLM's handshake check"))
    else:
        findings.append(error(
            f"prefill and decode use different variants ({sides}) whose KV caches differ "
            "(see kv.geometry and kv.dtype): the handshake check must stay on, and decode would "
            "refuse prefill",
            "fix kv.geometry and kv.dtype first; then pdserve switches the path check off"))
    return Verdict(findings, sides)
