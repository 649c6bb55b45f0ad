"""parallel.tensor: a worker given several GPUs runs tensor parallel over them
(inference.launch.parallel_args), which the model's heads and the KV hand-off must allow."""

from __future__ import annotations

from console.catalog.models import Variant
from console.checks.base import Finding, Verdict, check, error
from console.checks.plan import PlanView, group, who
from console.deployments.models import WorkerPlan
from inference.kv_channels import SharedStorageChannel


def size(worker: WorkerPlan) -> int:
    """The worker's tensor-parallel size: its GPU count (a CPU worker runs as one)."""
    return max(1, len(worker.gpu_tuple()))


def splits(variant: Variant, tensor: int) -> bool:
    """Whether vLLM can split the variant over ``tensor`` GPUs: every GPU gets whole attention
    heads, and the KV heads divide among the GPUs, or whole copies of them do."""
    heads, kv_heads = variant.num_attention_heads, variant.num_kv_heads
    if heads is None or kv_heads is None:
        return False
    if heads % tensor:
        return False
    return tensor % kv_heads == 0 if tensor >= kv_heads else kv_heads % tensor == 0


@check("parallel.tensor", "tensor-parallel sizes (GPUs per worker) split the model's heads and "
                          "fit the KV hand-off")
def tensor_parallel(plan: PlanView) -> Verdict:
    summary = "; ".join(f"{who(ws, plan)}: " + (f"tensor parallel {n}" if n > 1 else "unsplit")
                        for n, ws in group(plan.workers, size).items())
    parallel = [w for w in plan.workers if size(w) > 1]
    if not parallel:
        return Verdict(summary=f"no worker spans several GPUs ({summary})")
    findings: list[Finding] = []
    for variant, workers in group(parallel, lambda w: w.variant).items():
        findings += _heads(plan, variant, workers)
    if plan.is_pd:
        findings += _hand_off(plan, parallel)
    return Verdict(findings, summary)


def _heads(plan: PlanView, variant: Variant, workers: list[WorkerPlan]) -> list[Finding]:
    if not variant.inspected:
        return []  # model.path says why
    if variant.num_attention_heads is None:
        return [error(f"{who(workers, plan)} would run tensor parallel, but {variant} was "
                      "inspected before pdserve read num_attention_heads from config.json",
                      f"re-inspect {variant} (catalog page, or "
                      f"POST /api/v1/variants/{variant.pk}/inspect)")]
    findings = []
    for tensor, same in group(workers, size).items():
        if not splits(variant, tensor):
            findings.append(_unsplittable(plan, variant, tensor, same))
    return findings


def _unsplittable(plan: PlanView, variant: Variant, tensor: int,
                  workers: list[WorkerPlan]) -> Finding:
    heads, kv_heads = variant.num_attention_heads, variant.num_kv_heads
    if heads is not None and heads % tensor:
        problem = (f"config.json's num_attention_heads is {heads}, which {tensor} does not "
                   "divide: every GPU must get whole attention heads")
    else:
        problem = (f"config.json's num_key_value_heads is {kv_heads}: {tensor} GPUs can neither "
                   "share them out evenly nor hold whole copies of them")
    most = max(len(w.node.gpus.all()) for w in workers)
    fitting = [n for n in range(1, max(most, tensor) + 1) if splits(variant, n)]
    names = who(workers, plan)
    return error(f"{names} would run tensor parallel over its {tensor} GPUs ({variant}), but "
                 f"{problem}; vLLM refuses to start",
                 f"give {names} {' or '.join(map(str, fitting))} GPU(s) each")


def _hand_off(plan: PlanView, parallel: list[WorkerPlan]) -> list[Finding]:
    channel = plan.deployment.kv_channel
    if channel == SharedStorageChannel.name:
        return [error(
            f"{who(parallel, plan)} would run tensor parallel, but the shared-storage channel "
            "saves one file per layer named without the GPU's rank: the GPUs of one worker "
            "would overwrite each other's share of the KV cache, and decode would read one "
            "GPU's share for all",
            "use the nixl channel, or one GPU per worker")]
    prefill = group([w for w in plan.workers if w.role == "prefill"], size)
    decode = group([w for w in plan.workers if w.role == "decode"], size)
    findings = []
    for p, prefills in prefill.items():
        for d, decodes in decode.items():
            if max(p, d) % min(p, d):
                findings.append(error(
                    f"{who(prefills, plan)} runs tensor parallel {p} and {who(decodes, plan)} "
                    f"{d}: NIXL hands KV between different sizes only when one divides the "
                    "other (vLLM stops at the first hand-off otherwise)",
                    f"give prefill and decode GPU counts that divide each other, e.g. {p} and "
                    f"{p * max(1, round(d / p))}"))
    return findings
