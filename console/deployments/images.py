"""A plan's images, per worker: what each worker's vLLM is given for a multimodal variant, and
what the router lets through. One place, read by the command lines (console/control/
worker_specs.py) and by the checks that judge them (console/checks/multimodal.py, memory.py),
so that a check sees what a worker will actually run with."""

from __future__ import annotations

from console.deployments.models import Deployment, WorkerPlan

# The multimodal processor cache each worker of a multimodal variant is given, in GiB (vLLM
# --mm-processor-cache-gb). vLLM 0.32's default is 4 GiB, held once by the API server and once
# by the engine core (config/multimodal.py): on a small CPU node more than the model. 1 GiB
# keeps thousands of small processed images. A plan sets another size (0: no cache) with the
# flag among its extra engine flags, and the memory check counts that.
MM_PROCESSOR_CACHE_GB = 1.0
PROCESSOR_CACHE_FLAG = "--mm-processor-cache-gb"
# Processes of one worker that each hold a processor cache of that size: vLLM's API server and
# its engine core (api_server_count + data_parallel_size, both 1 here).
PROCESSOR_CACHE_COPIES = 2
# vLLM 0.32 sizes a worker's encoder cache (outputs of the vision encoder waiting to be
# consumed) at max_num_batched_tokens, or one item's tokens if more (v1/core/
# encoder_cache_manager.py compute_mm_encoder_budget, config/scheduler.py); the API server's
# default max_num_batched_tokens is 2048 on the CPU and on most GPUs (engine/arg_utils.py).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def mm_limits(deployment: Deployment, worker: WorkerPlan) -> dict[str, int]:
    """What the worker's variant takes besides text, each at the plan's count per request
    (vLLM --limit-mm-per-prompt); empty for a text model, which gets no multimodal flags."""
    return {modality: deployment.max_images_per_prompt
            for modality in worker.variant.modalities if modality == "image"}


def router_max_images(deployment: Deployment, workers: list[WorkerPlan]) -> int:
    """The images a request may carry through the router: the plan's count when every worker's
    variant takes images, else 0 (the router then answers 400 to any image)."""
    takes_images = bool(workers) and all("image" in w.variant.modalities for w in workers)
    return deployment.max_images_per_prompt if takes_images else 0


def _extra_flag(deployment: Deployment, name: str) -> str | None:
    """The value the plan's extra engine flags give ``name`` (``--flag value`` or
    ``--flag=value``; vLLM also takes underscores), or None when they do not set it."""
    names = (name, name.replace("-", "_").replace("__", "--", 1))
    args = list(deployment.extra_engine_args or ())
    for index, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag in names:
            return value or (args[index + 1] if index + 1 < len(args) else "")
    return None


def encoder_cache_tokens(deployment: Deployment) -> tuple[int, str]:
    """The encoder cache's budget in tokens, and where it comes from: the plan's
    --max-num-batched-tokens among its extra engine flags, else vLLM's default."""
    value = _extra_flag(deployment, "--max-num-batched-tokens")
    if value is not None and value.isdigit():
        return int(value), "--max-num-batched-tokens"
    return DEFAULT_MAX_NUM_BATCHED_TOKENS, "vLLM's default max_num_batched_tokens"


def processor_cache_gb(deployment: Deployment) -> tuple[float, bool]:
    """Each multimodal worker's processor cache in GiB, and whether the plan's extra engine
    flags set it (then the command line carries theirs, and pdserve adds none)."""
    value = _extra_flag(deployment, PROCESSOR_CACHE_FLAG)
    if value is None:
        return MM_PROCESSOR_CACHE_GB, False
    try:
        return float(value), True
    except ValueError:
        # vLLM's parser refuses it when the plan is saved (engine_args.py); a plan stored
        # before that check counts pdserve's size.
        return MM_PROCESSOR_CACHE_GB, False


def cache_flag_gb(deployment: Deployment) -> float | None:
    """The processor cache size pdserve puts on a worker's command line: None when the plan's
    extra engine flags carry their own."""
    size, from_plan_flags = processor_cache_gb(deployment)
    return None if from_plan_flags else size
