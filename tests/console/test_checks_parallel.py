"""parallel.tensor: a worker's GPU count is its tensor-parallel size, which must split the model's
attention and KV heads as vLLM requires, and fit the KV hand-off between prefill and decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.fleet.models import GIB, Gpu, Node
from tests.console.tiny_models import make_plan, register, run, use_variant

pytestmark = pytest.mark.django_db

CHECK = "parallel.tensor"


def gpu_node(name: str, address: str) -> Node:
    node = Node.objects.create(name=name, address=address, cpu_ids=list(range(32)),
                               memory_bytes=512 * GIB, engine_package="vllm")
    Gpu.objects.bulk_create(Gpu(node=node, index=i, name="NVIDIA H100", memory_bytes=80 * GIB)
                            for i in range(8))
    return node


def heads(attention: int, kv: int) -> dict[str, Any]:
    return {"num_attention_heads": attention, "num_key_value_heads": kv,
            "hidden_size": 16 * attention, "head_dim": 16}


@pytest.fixture
def plan(tmp_path: Path) -> Deployment:
    """Prefill on four GPUs of node a, decode on all eight of node b, over NIXL."""
    deployment = make_plan(tmp_path, kv_channel="nixl")
    a, b = gpu_node("gpu-a", "10.0.0.1"), gpu_node("gpu-b", "10.0.0.2")
    deployment.workers.filter(role="prefill").update(node=a, host=a.address, cpu_cores="",
                                                     gpu_indices="0,1,2,3")
    deployment.workers.filter(role="decode").update(node=b, host=b.address, cpu_cores="",
                                                    gpu_indices="0,1,2,3,4,5,6,7")
    return deployment


def variant(plan: Deployment, tmp_path: Path, name: str, attention: int, kv: int) -> Variant:
    made = register(plan.base_model, tmp_path, name, config=heads(attention, kv))
    use_variant(plan, made, "prefill")
    use_variant(plan, made, "decode")
    return made


def test_sizes_that_split_the_heads_and_divide_each_other_pass(plan: Deployment,
                                                               tmp_path: Path) -> None:
    variant(plan, tmp_path, "h32-kv8", 32, 8)
    outcome = run(plan, CHECK)
    assert outcome.status == "pass", outcome.results
    assert outcome.summary == "prefill: tensor parallel 4; decode: tensor parallel 8"
    # Fewer KV heads than GPUs: vLLM keeps whole copies of them on each GPU.
    variant(plan, tmp_path, "h32-kv2", 32, 2)
    assert run(plan, CHECK).status == "pass"


def test_attention_heads_the_size_does_not_divide_are_an_error_naming_the_field(
        plan: Deployment, tmp_path: Path) -> None:
    # SmolLM2-135M's geometry: 9 heads, 3 KV heads.
    variant(plan, tmp_path, "smollm2-like", 9, 3)
    plan.workers.filter(role="decode").update(gpu_indices="0")
    outcome = run(plan, CHECK)
    assert outcome.status == "error"
    [result] = outcome.results
    assert result.message.startswith("prefill would run tensor parallel over its 4 GPUs")
    assert "num_attention_heads is 9, which 4 does not divide" in result.message
    assert "vLLM refuses to start" in result.message
    assert result.hint == "give prefill 1 or 3 GPU(s) each"

    plan.workers.filter(role="prefill").update(gpu_indices="0,1,2")
    assert run(plan, CHECK).status == "pass"


def test_kv_heads_that_neither_divide_nor_copy_evenly_are_an_error_naming_the_field(
        plan: Deployment, tmp_path: Path) -> None:
    variant(plan, tmp_path, "h12-kv3", 12, 3)
    plan.workers.filter(role="decode").update(gpu_indices="0,1,2,3")
    outcome = run(plan, CHECK)
    [result] = outcome.results
    assert "num_key_value_heads is 3" in result.message
    assert result.hint == "give prefill, decode 1 or 3 or 6 GPU(s) each"


def test_prefill_and_decode_sizes_must_divide_each_other_for_nixl(plan: Deployment,
                                                                  tmp_path: Path) -> None:
    variant(plan, tmp_path, "h24-kv24", 24, 24)
    plan.workers.filter(role="decode").update(gpu_indices="0,1,2,3,4,5")
    outcome = run(plan, CHECK)
    [result] = outcome.results
    assert "prefill runs tensor parallel 4 and decode 6" in result.message
    assert "only when one divides the other" in result.message

    plan.workers.filter(role="decode").update(gpu_indices="0,1")
    assert run(plan, CHECK).status == "pass"


def test_the_shared_storage_channel_refuses_tensor_parallel_workers(plan: Deployment,
                                                                    tmp_path: Path) -> None:
    variant(plan, tmp_path, "h32-kv8", 32, 8)
    Deployment.objects.filter(pk=plan.pk).update(kv_channel="shared-storage")
    outcome = run(plan, CHECK)
    [result] = outcome.results
    assert "named without the GPU's rank" in result.message
    assert result.hint == "use the nixl channel, or one GPU per worker"

    plan.workers.update(gpu_indices="0")
    assert run(plan, CHECK).status == "pass"


def test_a_variant_inspected_before_the_heads_were_read_asks_for_reinspection(
        plan: Deployment, tmp_path: Path) -> None:
    old = variant(plan, tmp_path, "h32-kv8", 32, 8)
    Variant.objects.filter(pk=old.pk).update(num_attention_heads=None)
    [result] = run(plan, CHECK).results
    assert "inspected before pdserve read num_attention_heads" in result.message
    assert f"POST /api/v1/variants/{old.pk}/inspect" in result.hint


def test_a_plan_without_multi_gpu_workers_passes_and_says_so(tmp_path: Path) -> None:
    outcome = run(make_plan(tmp_path), CHECK)
    assert outcome.status == "pass"
    assert outcome.summary == "no worker spans several GPUs (prefill, decode: unsplit)"
