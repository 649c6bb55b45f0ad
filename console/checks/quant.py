"""quant.kernel: every quantized variant has a kernel for the plan's compute dtype on its device.

vLLM's CPU kernel for 4-bit weight-only checkpoints (CPUWNA16) computes in bfloat16 or float16
only: a float32 worker with a W4A16 variant dies at warm-up with ``"cpu_gemm_wna16" not
implemented for 'Float'``, after a minute or two of loading.
"""

from __future__ import annotations

from console.checks.base import Finding, Verdict, check, error
from console.checks.plan import PlanView, who
from console.deployments.models import WorkerPlan

CPU_WNA16_DTYPES = ("bfloat16", "float16")


def _weight_only_4bit(worker: WorkerPlan) -> bool:
    return worker.variant.quantization.endswith(" w4a16")


@check("quant.kernel", "quantized variants have a kernel for the compute dtype")
def quant_kernel(plan: PlanView) -> Verdict:
    findings: list[Finding] = []
    wanted = plan.deployment.dtype
    affected = [w for w in plan.workers
                if plan.device_kind(w) == "cpu" and _weight_only_4bit(w)]
    for worker in affected:
        dtype = worker.variant.dtype if wanted == "auto" else wanted
        if dtype not in CPU_WNA16_DTYPES:
            findings.append(error(
                f"{who([worker], plan)} runs the W4A16 variant {worker.variant} in {dtype} on the "
                "CPU, where vLLM's 4-bit kernel (CPUWNA16) has no float32 path",
                "set the plan's compute dtype to bfloat16, or use a W8A8 variant for this role"))
    if not affected:
        return Verdict(findings, "no 4-bit weight-only variant on a CPU worker")
    return Verdict(findings, f"W4A16 on the CPU in {wanted}")
