"""One test per check about what both sides load: each makes the check fail, then fixes the plan
the way the hint says and sees it pass. The model directories are tiny but real (tiny_models.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from console.catalog.hashing import hash_weights
from console.catalog.models import BaseModel, Variant
from console.catalog.services import ensure_variant, reinspect
from console.checks.suite import CHECKS, run_checks
from console.deployments.models import Deployment, WorkerPlan
from console.fleet.models import Node
from console.fleet.services import local_node
from tests.console.tiny_models import (
    AVX512_FLAGS,
    QUANTIZED_W4A16,
    QUANTIZED_W8A8,
    make_plan,
    register,
    run,
    use_variant,
    write_model,
)

pytestmark = pytest.mark.django_db

BY_ID = {check.id for check in CHECKS}


def decode(deployment: Deployment) -> WorkerPlan:
    return deployment.workers.get(role="decode")


def base(deployment: Deployment) -> BaseModel:
    return deployment.base_model


@pytest.fixture
def plan(tmp_path: Path) -> Deployment:
    return make_plan(tmp_path)


def test_the_fixture_plan_passes_every_check(plan: Deployment) -> None:
    report = run_checks(plan)
    assert report.ok, [r.as_dict() for r in report.errors]
    assert {o.id for o in report.outcomes} == BY_ID
    assert {o.status for o in report.outcomes} <= {"pass", "warning"}


def test_a_plan_without_workers_is_an_error(plan: Deployment) -> None:
    plan.workers.all().delete()
    report = run_checks(plan)
    assert [(r.id, r.message) for r in report.errors] == [
        ("plan.workers", "tiny-1p1d plans no workers")]


# ---- model.same_base ------------------------------------------------------------------------


def test_same_base_fails_for_a_variant_of_another_model(plan: Deployment, tmp_path: Path) -> None:
    other = register(BaseModel.objects.create(name="other"), tmp_path, "other-bf16")
    use_variant(plan, other)
    outcome = run(plan, "model.same_base")
    assert outcome.status == "error"
    [result] = outcome.results
    assert "other/other-bf16" in result.message and "tiny" in result.message
    assert "pick a variant of tiny" in result.hint

    use_variant(plan, plan.workers.get(role="prefill").variant)
    assert run(plan, "model.same_base").status == "pass"


def test_same_base_allows_only_quantizations_as_different_variants(plan: Deployment,
                                                                   tmp_path: Path) -> None:
    original = plan.workers.get(role="prefill").variant
    retrained = register(base(plan), tmp_path, "bf16-retrained", weights_fill=7)
    for variant in (original, retrained):
        reinspect(variant)  # queue a hashing job, then run its body here
        hash_weights(variant.pk, Variant.objects.get(pk=variant.pk).hash_job)
    use_variant(plan, retrained)
    outcome = run(plan, "model.same_base")
    assert outcome.status == "error"
    assert "different weights" in outcome.results[0].message
    assert "bf16-retrained" in outcome.results[0].message

    use_variant(plan, register(base(plan), tmp_path, "w8a8", config=QUANTIZED_W8A8))
    outcome = run(plan, "model.same_base")
    assert outcome.status == "pass"
    assert "quantizations of tiny" in outcome.summary


# ---- model.path -----------------------------------------------------------------------------


def test_model_path_fails_when_the_files_changed_or_vanished(plan: Deployment) -> None:
    variant = decode(plan).variant
    weights = Path(variant.path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0" * 8)
    outcome = run(plan, "model.path")
    assert outcome.status == "error"
    assert "model.safetensors" in outcome.results[0].message
    assert "changed since inspection" in outcome.results[0].message
    assert f"/api/v1/variants/{variant.pk}/inspect" in outcome.results[0].hint

    shutil.rmtree(variant.path)
    assert "missing or not a directory" in run(plan, "model.path").results[0].message

    write_model(Path(variant.path))
    reinspect(variant)
    assert run(plan, "model.path").status == "pass"


def test_model_path_reports_a_directory_that_cannot_be_inspected(plan: Deployment,
                                                                 tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    use_variant(plan, ensure_variant(base(plan), "broken", str(broken)))
    outcome = run(plan, "model.path")
    assert outcome.status == "error"
    assert "could not be inspected: missing config.json" in outcome.results[0].message
    # The checks that need the variant's facts say they could not compare, not that all is well.
    assert run(plan, "kv.geometry").status == "skipped"

    write_model(broken)
    reinspect(Variant.objects.get(name="broken"))
    assert run(plan, "model.path").status == "pass"


# ---- kv.geometry, kv.dtype, kv.block_size ---------------------------------------------------


def test_kv_geometry_fails_for_different_layers(plan: Deployment, tmp_path: Path) -> None:
    deeper = register(base(plan), tmp_path, "deeper", config={"num_hidden_layers": 3})
    use_variant(plan, deeper)
    outcome = run(plan, "kv.geometry")
    assert outcome.status == "error"
    message = outcome.results[0].message
    assert "prefill (bf16): 2 layers x 2 KV heads x head dim 16" in message
    assert "decode (deeper): 3 layers x 2 KV heads x head dim 16" in message

    use_variant(plan, register(base(plan), tmp_path, "w8a8", config=QUANTIZED_W8A8))
    assert run(plan, "kv.geometry").status == "pass"


def test_kv_dtype_fails_when_auto_resolves_differently(plan: Deployment, tmp_path: Path) -> None:
    Deployment.objects.filter(pk=plan.pk).update(dtype="auto")
    use_variant(plan, register(base(plan), tmp_path, "fp16", config={"dtype": "float16"},
                               dtype="F16"))
    outcome = run(plan, "kv.dtype")
    assert outcome.status == "error"
    assert "prefill (bf16): bfloat16" in outcome.results[0].message
    assert "decode (fp16): float16" in outcome.results[0].message
    assert "set the plan's KV cache dtype explicitly" in outcome.results[0].hint

    Deployment.objects.filter(pk=plan.pk).update(kv_cache_dtype="bfloat16")
    assert run(plan, "kv.dtype").status == "pass"


def test_kv_dtype_follows_a_checkpoints_kv_cache_scheme(plan: Deployment, tmp_path: Path) -> None:
    scheme = {"quantization_config": {**QUANTIZED_W8A8["quantization_config"],
                                      "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    use_variant(plan, register(base(plan), tmp_path, "w8a8-kv8", config=scheme))
    outcome = run(plan, "kv.dtype")
    assert outcome.status == "error"
    assert "decode (w8a8-kv8): fp8" in outcome.results[0].message

    Deployment.objects.filter(pk=plan.pk).update(kv_cache_dtype="fp8")
    assert run(plan, "kv.dtype").status == "pass"


def test_kv_block_size_fails_when_devices_default_differently(plan: Deployment) -> None:
    plan.workers.filter(role="prefill").update(gpu_indices="0", cpu_cores="")
    outcome = run(plan, "kv.block_size")
    assert outcome.status == "error"
    assert "16 tokens (engine default)" in outcome.results[0].message
    assert "128 tokens (engine default)" in outcome.results[0].message

    Deployment.objects.filter(pk=plan.pk).update(block_size=128)
    outcome = run(plan, "kv.block_size")
    assert outcome.status == "pass"
    assert "128 tokens" in outcome.summary


# ---- context.length -------------------------------------------------------------------------


def test_context_length_within_the_model_and_above_the_longest_request(plan: Deployment) -> None:
    Deployment.objects.filter(pk=plan.pk).update(max_model_len=8192, longest_request=1024)
    outcome = run(plan, "context.length")
    assert outcome.status == "error"
    assert "context length 8192 exceeds" in outcome.results[0].message
    assert "4096 positions" in outcome.results[0].message

    Deployment.objects.filter(pk=plan.pk).update(max_model_len=2048, longest_request=3000)
    outcome = run(plan, "context.length")
    assert outcome.status == "error"
    assert "up to 3000 tokens but the context length is 2048" in outcome.results[0].message
    assert "at least 3000 (the model allows 4096)" in outcome.results[0].hint

    Deployment.objects.filter(pk=plan.pk).update(max_model_len=3000)
    outcome = run(plan, "context.length")
    assert outcome.status == "pass"
    assert "3000 tokens on prefill, decode and the router" in outcome.summary


# ---- tokenizer.hash, chat_template.hash -----------------------------------------------------


def test_tokenizer_hash_names_the_file_that_differs(plan: Deployment, tmp_path: Path) -> None:
    other = {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "c": 1}, "merges": []},
             "added_tokens": []}
    use_variant(plan, register(base(plan), tmp_path, "other-vocab", tokenizer=other,
                               config=QUANTIZED_W8A8))
    outcome = run(plan, "tokenizer.hash")
    assert outcome.status == "error"
    assert "files that differ: tokenizer.json" in outcome.results[0].message

    variant = Variant.objects.get(name="other-vocab")
    write_model(Path(variant.path), config=QUANTIZED_W8A8)
    reinspect(variant)
    assert run(plan, "tokenizer.hash").status == "pass"


def test_tokenizer_hash_ignores_how_the_tokenizer_was_saved(plan: Deployment,
                                                            tmp_path: Path) -> None:
    variant = register(base(plan), tmp_path, "resaved", config=QUANTIZED_W8A8)
    config = Path(variant.path) / "tokenizer_config.json"
    # Another transformers version re-indents and adds bookkeeping keys; the tokens are the same.
    config.write_text(json.dumps({**json.loads(config.read_text()), "is_local": True,
                                  "transformers_version": "5.0"}, indent=4))
    reinspect(variant)
    use_variant(plan, variant)
    assert run(plan, "tokenizer.hash").status == "pass"


def test_chat_template_hash_fails_for_another_template(plan: Deployment, tmp_path: Path) -> None:
    use_variant(plan, register(base(plan), tmp_path, "other-template", config=QUANTIZED_W8A8,
                               chat_template="{{ messages[-1]['content'] }}"))
    outcome = run(plan, "chat_template.hash")
    assert outcome.status == "error"
    assert "chat templates differ" in outcome.results[0].message
    assert "copy chat_template.jinja" in outcome.results[0].hint

    use_variant(plan, register(base(plan), tmp_path, "same-template", config=QUANTIZED_W8A8))
    assert run(plan, "chat_template.hash").status == "pass"


# ---- sampling.defaults ----------------------------------------------------------------------


def test_sampling_defaults_fail_when_a_generation_config_differs(plan: Deployment,
                                                                tmp_path: Path) -> None:
    Deployment.objects.filter(pk=plan.pk).update(sampling_defaults={})
    use_variant(plan, register(base(plan), tmp_path, "sampled", config=QUANTIZED_W8A8,
                               generation_config={"temperature": 0.6, "top_p": 0.9}))
    outcome = run(plan, "sampling.defaults")
    assert outcome.status == "error"
    result = outcome.results[0]
    assert "(temperature, top_p)" in result.message
    assert "prefill (bf16): {} (vLLM's neutral defaults)" in result.message
    assert 'decode (sampled): {"temperature": 0.6, "top_p": 0.9}' in result.message

    # The hint's suggestion, pinned in the plan, overrides both generation configs alike.
    suggestion = json.loads(result.hint[result.hint.index("{"):])
    assert suggestion == {"temperature": 0.6, "top_p": 0.9}
    Deployment.objects.filter(pk=plan.pk).update(sampling_defaults=suggestion)
    assert run(plan, "sampling.defaults").status == "pass"


# ---- engine.version, engine.connector -------------------------------------------------------


@pytest.fixture
def remote(db: None) -> Node:
    return Node.objects.create(name="gpu-b", address="10.0.0.2", cpu_ids=[0, 1, 2, 3],
                               memory_bytes=64 << 30, engine_package="vllm",
                               engine_version=local_node().engine_version,
                               kv_connectors=["PdserveSharedStorageConnector", "NixlConnector"])


def test_engine_version_fails_for_a_node_with_another_vllm(plan: Deployment, remote: Node) -> None:
    Node.objects.filter(pk=remote.pk).update(engine_version="0.31.0")
    plan.workers.filter(role="decode").update(node=remote)
    outcome = run(plan, "engine.version")
    assert outcome.status == "error"
    wanted = plan.engine_version
    assert f"node gpu-b runs vLLM 0.31.0; the plan wants {wanted}" in outcome.results[0].message
    assert f"install vLLM {wanted} on gpu-b" in outcome.results[0].hint

    Node.objects.filter(pk=remote.pk).update(engine_version=wanted)
    assert run(plan, "engine.version").status == "pass"


def test_engine_connector_needs_one_host_for_shared_storage(plan: Deployment, remote: Node) -> None:
    plan.workers.filter(role="decode").update(node=remote)
    outcome = run(plan, "engine.connector")
    assert outcome.status == "error"
    assert "shared-storage channel keeps KV files in a directory of one host" in \
        outcome.results[0].message
    assert "use the nixl channel across hosts" in outcome.results[0].hint

    Node.objects.filter(pk=remote.pk).update(kv_connectors=["PdserveSharedStorageConnector"])
    Deployment.objects.filter(pk=plan.pk).update(kv_channel="nixl")
    outcome = run(plan, "engine.connector")
    assert outcome.status == "error"
    assert "gpu-b cannot run NixlConnector" in outcome.results[0].message

    Node.objects.filter(pk=remote.pk).update(kv_connectors=["PdserveSharedStorageConnector", "NixlConnector"])
    outcome = run(plan, "engine.connector")
    assert outcome.status == "pass"
    assert "prefill: NixlConnector as kv_producer; decode: NixlConnector as kv_consumer" in \
        outcome.summary


# ---- quant.kernel ---------------------------------------------------------------------------

@pytest.mark.parametrize(("dtype", "status"), [("float32", "error"), ("bfloat16", "pass"),
                                               ("float16", "pass")])
def test_a_w4a16_cpu_worker_needs_a_half_precision_compute_dtype(
        plan: Deployment, tmp_path: Path, dtype: str, status: str) -> None:
    use_variant(plan, register(base(plan), tmp_path, "w4a16", config=QUANTIZED_W4A16))
    Node.objects.filter(pk=local_node().pk).update(cpu_flags=AVX512_FLAGS)
    Deployment.objects.filter(pk=plan.pk).update(dtype=dtype)
    outcome = run(plan, "quant.kernel")
    assert outcome.status == status
    if status == "error":
        [result] = outcome.results
        assert "decode" in result.message and "float32" in result.message
        assert "bfloat16" in result.hint


def test_w8a8_and_unquantized_variants_run_in_float32(plan: Deployment, tmp_path: Path) -> None:
    use_variant(plan, register(base(plan), tmp_path, "w8a8", config=QUANTIZED_W8A8))
    Deployment.objects.filter(pk=plan.pk).update(dtype="float32")
    assert run(plan, "quant.kernel").status == "pass"
