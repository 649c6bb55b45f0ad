"""model.same_base and model.path: both sides load checkpoints of one model, from real files."""

from __future__ import annotations

import os
from itertools import combinations
from pathlib import Path

from console.catalog.copies import request_verification
from console.catalog.models import Variant, VariantCopy
from console.catalog.services import changed_weight_files
from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView, who
from console.deployments.models import WorkerPlan
from console.fleet.models import Node, NodeAgent


@check("model.same_base", "prefill and decode variants derive from one base model")
def same_base(plan: PlanView) -> Verdict:
    base = plan.deployment.base_model
    findings = [
        error(f"{who(ws, plan)} uses {variant}, a variant of {variant.base.name}; the plan's base "
              f"model is {base.name}",
              f"pick a variant of {base.name} for {who(ws, plan)}, or change the plan's base model")
        for variant, ws in _by_variant(plan).items() if variant.base_id != base.pk
    ]
    variants = [v for v in _by_variant(plan) if v.inspected and v.base_id == base.pk]
    for a, b in combinations(variants, 2):
        finding = _compare(plan, a, b)
        if finding is not None:
            findings.append(finding)
    names = " and ".join(f"{who(ws, plan)} {v}" for v, ws in _by_variant(plan).items())
    if len(variants) > 1:
        return Verdict(findings, f"{names}: quantizations of {base.name}")
    return Verdict(findings, f"{names}")


def _by_variant(plan: PlanView) -> dict[Variant, list[WorkerPlan]]:
    groups: dict[Variant, list[WorkerPlan]] = {}
    for worker in plan.workers:
        groups.setdefault(worker.variant, []).append(worker)
    return groups


def _compare(plan: PlanView, a: Variant, b: Variant) -> Finding | None:
    """Two different variants are allowed only as quantizations (or casts) of the same model."""
    groups = _by_variant(plan)
    sides = f"{who(groups[a], plan)} uses {a}, {who(groups[b], plan)} uses {b}"
    if a.architecture != b.architecture:
        return error(f"{sides}: different architectures ({a.architecture} vs {b.architecture})",
                     "use checkpoints of one base model on both sides")
    if a.is_quantized or b.is_quantized or a.dtype != b.dtype:
        return None
    if a.weights_sha256 and b.weights_sha256:
        if a.weights_sha256 == b.weights_sha256:
            return None
        return error(f"{sides}: both unquantized {a.dtype} with different weights "
                     f"(sha256 {a.weights_sha256[:12]}… vs {b.weights_sha256[:12]}…): "
                     "not quantizations of one model, so prefill and decode would disagree",
                     "use the same variant on both sides, or a quantization of it on one side")
    return warning(f"{sides}: both unquantized {a.dtype}; whether they are the same weights is "
                   f"known once hashing finishes ({a.hash_status}; {b.hash_status})",
                   "wait for hashing, or use one variant on both sides")


@check("model.path", "model directories exist, are readable and hold the inspected files")
def path(plan: PlanView) -> Verdict:
    findings: list[Finding] = []
    places: list[str] = []
    seen: set[tuple[int, int]] = set()
    for worker in plan.workers:
        key = (worker.variant_id, worker.node_id)
        if key in seen:
            continue
        seen.add(key)
        variant, node = worker.variant, worker.node
        readers = who([w for w in plan.workers
                       if (w.variant_id, w.node_id) == key], plan)
        places.append(f"{readers}: {variant.path} on {node.name} ({variant.hash_status})")
        if not plan.is_local(node):
            finding, place = _remote_copy(variant, node, readers)
            places[-1] = f"{readers}: {variant.path} on {node.name} ({place})"
            findings += [finding] if finding is not None else []
            continue
        findings += _local_directory(variant, readers)
    return Verdict(findings, "; ".join(places))


def _remote_copy(variant: Variant, node: Node, readers: str) -> tuple[Finding | None, str]:
    """The variant's files on another node, as its agent verified them (console/catalog/
    copies.py); asked of the agent when there is no answer for the current inspection."""
    same = (f"make sure {node.name} holds the same files: sha256 of the weights "
            f"{variant.weights_sha256 or '(not computed yet)'}")
    agent = NodeAgent.objects.filter(node=node).first()
    if agent is None or agent.state != NodeAgent.State.UP:
        return warning(f"{readers} read {variant.path} on node {node.name}, which no agent up "
                       "there can verify now", same), "not verified"
    if not variant.inspected:
        return error(f"{variant} at {variant.path} has not been inspected where the console "
                     "runs: nothing to compare node copies with",
                     f"inspect it: POST /api/v1/variants/{variant.pk}/inspect"), "not inspected"
    copy = request_verification(variant, node)
    state = VariantCopy.State
    if copy.state in (state.PENDING, state.HASHING):
        total = max(1, variant.weight_bytes)
        return warning(f"{readers}: node {node.name}'s agent is verifying {variant.path} "
                       f"({copy.state}, {100 * copy.bytes_done // total}%)",
                       "check again once it is done (the files are hashed there)"), copy.state
    if copy.state == state.VERIFIED and variant.weights_sha256 and \
            copy.sha256 != variant.weights_sha256:
        return error(f"{readers}: {variant.path} on node {node.name} holds other weights (sha256 "
                     f"{copy.sha256[:12]}… there, {variant.weights_sha256[:12]}… where "
                     "inspected)", same), "different"
    if copy.state == state.VERIFIED:
        return None, f"verified by its agent, sha256 {copy.sha256[:12]}…"
    if copy.state == state.FAILED:
        return warning(f"{readers}: node {node.name} could not verify {variant.path}: "
                       f"{copy.detail}", same), "not verified"
    return error(f"{readers}: {variant.path} on node {node.name}: {copy.detail}", same), copy.state


def _local_directory(variant: Variant, readers: str) -> list[Finding]:
    reinspect = (f"fix the directory, then re-inspect the variant (catalog page, or "
                 f"POST /api/v1/variants/{variant.pk}/inspect)")
    if variant.inspection_error:
        return [error(f"{variant} at {variant.path} could not be inspected: "
                      f"{variant.inspection_error}", reinspect)]
    if variant.inspected_at is None:
        return [error(f"{variant} at {variant.path} has never been inspected", reinspect)]
    root = Path(variant.path)
    if not root.is_dir():
        return [error(f"{readers}: {variant.path} ({variant}) is missing or not a directory",
                      reinspect)]
    unreadable = [name for name in ["config.json", *(f["name"] for f in variant.weight_files)]
                  if not os.access(root / name, os.R_OK)]
    if unreadable:
        return [error(f"{readers}: cannot read {', '.join(unreadable)} in {variant.path}",
                      "give the console's user read access to the model files")]
    changed = changed_weight_files(variant)
    if changed:
        return [error(f"{variant}'s weight files changed since inspection: {', '.join(changed)}; "
                      "the recorded geometry, tokenizer and sha256 may no longer hold",
                      reinspect.replace("fix the directory, then ", ""))]
    if variant.hash_state == Variant.HashState.FAILED:
        return [warning(f"{variant}: {variant.hash_status}", reinspect.replace(
            "fix the directory, then ", ""))]
    return []
