"""multimodal.processor and multimodal.limits: both sides turn an image into the same tokens,
and take the same number of images.

The router sends an image request whole to prefill and to decode (decode needs the image too:
M-RoPE positions come from the image's grid), so each side runs its own processor on it. A
different processor configuration (image size, patching, tokens per image) gives prompts of
different lengths and KV that does not match; a different image count refuses on one side what
the other took.
"""

from __future__ import annotations

from console.checks.base import Finding, Verdict, check, error, warning
from console.checks.plan import PlanView, describe, who
from console.deployments.images import mm_limits, router_max_images
from console.deployments.models import Deployment


def _short(digest: str) -> str:
    return f"processor {digest[:12]}…" if digest else "no processor configuration"


def _modalities(modalities: tuple[str, ...]) -> str:
    return " + ".join(modalities) or "text"


@check("multimodal.processor", "same modalities and processor configuration on both sides")
def processor(plan: PlanView) -> Verdict:
    if plan.uninspected():
        return Verdict(summary="not compared: a variant is not inspected (see model.path)",
                       skipped=True)
    if not any(v.is_multimodal for v in plan.variants()):
        return Verdict(summary="text-only: every variant takes text alone, no processor to "
                               "compare")
    findings: list[Finding] = []
    count, text = describe(plan, lambda w: tuple(w.variant.modalities), _modalities)
    if count > 1:
        findings.append(error(
            f"the variants take different inputs: {text}",
            "use checkpoints of one multimodal model on both sides (a text model cannot "
            "decode a prompt whose image the other side encoded)"))
    count, processors = describe(plan, lambda w: w.variant.processor_sha256, _short)
    if count > 1:
        files = _differing_files(plan)
        findings.append(error(
            f"processor configurations differ: {processors}"
            + (f"; files that differ: {', '.join(files)}" if files else ""),
            "give every variant the base model's processor files (copy preprocessor_config.json "
            "and processor_config.json from one variant into the other's directory), then "
            "re-inspect it"))
    return Verdict(findings, f"{text}; {processors}")


def _differing_files(plan: PlanView) -> list[str]:
    variants = plan.variants()
    names = sorted({name for v in variants for name in v.processor_files})
    return [name for name in names
            if len({v.processor_files.get(name, "") for v in variants}) > 1]


def _limits(limits: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{count} {modality}" for modality, count in limits) or "text only"


@check("multimodal.limits", "the same image limits on every worker and the router")
def limits(plan: PlanView) -> Verdict:
    deployment = plan.deployment
    if plan.uninspected():
        return Verdict(summary="not compared: a variant is not inspected (see model.path)",
                       skipped=True)
    # Each worker's --limit-mm-per-prompt as its command line gets it (console/deployments/
    # images.py, which console/control/worker_specs.py calls).
    count, text = describe(plan, lambda w: tuple(sorted(mm_limits(deployment, w).items())),
                           _limits)
    router = router_max_images(deployment, plan.workers)
    summary = (f"{text}; router: {router} image(s) a request, each at most "
               f"{deployment.max_image_bytes} bytes and {deployment.max_image_pixels} pixels")
    findings: list[Finding] = []
    if count > 1:
        findings.append(error(
            f"the workers would take different numbers of images: {text}; the router lets "
            f"{router} through",
            "use one multimodal variant on every worker, so that each gets the plan's "
            "max_images_per_prompt"))
    if not any(v.is_multimodal for v in plan.variants()):
        finding = _text_only(deployment, plan)
        if finding is not None:
            findings.append(finding)
    return Verdict(findings, summary)


def _text_only(deployment: Deployment, plan: PlanView) -> Finding | None:
    """A text-only plan that names image settings: they do nothing, and the router refuses every
    image; the default count (1) alone says nothing and is left alone."""
    default = Deployment._meta.get_field("max_images_per_prompt").default
    named = []
    if deployment.max_images_per_prompt not in (0, default):
        named.append(f"max_images_per_prompt {deployment.max_images_per_prompt}")
    if deployment.media_paths:
        named.append(f"media_paths {', '.join(deployment.media_paths)}")
    if deployment.media_domains:
        named.append(f"media_domains {', '.join(deployment.media_domains)}")
    if not named:
        return None
    return warning(
        f"the plan sets {'; '.join(named)}, but {who(plan.workers, plan)} serve text-only "
        f"variants: the router refuses every image (--max-images 0)",
        "use a multimodal variant (its catalog entry lists image among its modalities), or "
        "clear the image settings")
