"""kv.geometry, kv.dtype, kv.block_size: the KV cache prefill writes is the one decode reads."""

from __future__ import annotations

from console.checks.base import Verdict, check, error
from console.checks.plan import PlanView, describe, node_names


def _skipped(plan: PlanView) -> Verdict | None:
    missing = plan.uninspected()
    if not missing:
        return None
    names = ", ".join(str(v) for v in missing)
    return Verdict(summary=f"not compared: {names} not inspected (see model.path)", skipped=True)


def geometry(plan: PlanView) -> tuple[int, str]:
    return describe(plan, lambda w: (w.variant.num_layers, w.variant.num_kv_heads,
                                     w.variant.head_dim),
                    lambda g: f"{g[0]} layers x {g[1]} KV heads x head dim {g[2]}")


def dtypes(plan: PlanView) -> tuple[int, str]:
    return describe(plan, plan.kv_dtype)


@check("kv.geometry", "layers, KV heads and head dim equal")
def kv_geometry(plan: PlanView) -> Verdict:
    skipped = _skipped(plan)
    if skipped:
        return skipped
    count, text = geometry(plan)
    if count > 1:
        return Verdict([error(f"KV geometry differs: {text}",
                              "use variants of one base model: quantization keeps the geometry, "
                              "a different model does not")], text)
    return Verdict(summary=text)


@check("kv.dtype", "KV cache dtype equal")
def kv_dtype(plan: PlanView) -> Verdict:
    skipped = _skipped(plan)
    if skipped:
        return skipped
    count, text = dtypes(plan)
    if count > 1:
        return Verdict([error(
            f"KV cache dtype differs: {text} (plan's KV dtype: {plan.deployment.kv_cache_dtype}, "
            f"compute dtype: {plan.deployment.dtype})",
            "set the plan's KV cache dtype explicitly (e.g. bfloat16) so both sides allocate "
            "the same cache; 'auto' follows each variant's dtype and quantization scheme")], text)
    return Verdict(summary=text)


@check("kv.block_size", "KV cache block size equal")
def kv_block_size(plan: PlanView) -> Verdict:
    configured = plan.deployment.block_size
    count, text = describe(plan, plan.block_size,
                           lambda size: f"{size} tokens" + ("" if configured else " (engine default)"),
                           where=lambda ws: node_names(ws) + ", " + plan.device_kind(ws[0]))
    if count > 1:
        return Verdict([error(
            f"KV block size differs: {text}",
            "set the plan's block size (e.g. 128, the CPU backend's size) so every worker uses "
            "the same; without one each device picks its own default")], text)
    return Verdict(summary=text)
