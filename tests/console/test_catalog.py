"""The model catalog: inspecting directories, registering them, hashing weights in the background."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.test import Client
from rest_framework.test import APIClient

from console.catalog.hashing import hash_weights
from console.catalog.inspection import (
    SUPPORTED_ARCHITECTURES,
    InspectionError,
    combined_sha256,
    inspect_model_dir,
)
from console.catalog.models import BaseModel, Variant
from console.catalog.services import ensure_variant, register_variant, reinspect
from console.celery import app
from tests.console.tiny_models import safetensors_bytes, write_model

State = Variant.HashState


# ---- inspection -----------------------------------------------------------------------------


def test_inspection_reads_what_a_worker_would_load(tmp_path: Path) -> None:
    found = inspect_model_dir(str(write_model(tmp_path / "m", generation_config={
        "temperature": 0.7, "bos_token_id": 1})))
    assert (found.architecture, found.dtype, found.quantization) == ("LlamaForCausalLM", "bfloat16",
                                                                     "")
    assert (found.num_layers, found.num_kv_heads, found.head_dim) == (2, 2, 16)
    assert (found.kv_dtype, found.kv_dtype_from_checkpoint) == ("bfloat16", False)
    # max_position_embeddings; the tokenizer's 1e30 model_max_length does not lower it.
    assert found.max_positions == 4096
    assert found.parameter_count == 32 * 64 + 64
    assert [f.name for f in found.weight_files] == ["model.safetensors"]
    assert set(found.tokenizer_files) == {"tokenizer.json", "tokenizer_config.json"}
    assert len(found.tokenizer_sha256) == len(found.chat_template_sha256) == 64
    assert found.generation_config == {"temperature": 0.7, "bos_token_id": 1}
    assert found.size_bytes == sum(p.stat().st_size for p in (tmp_path / "m").iterdir())


def test_inspection_reads_the_real_default_model_layout(tmp_path: Path) -> None:
    # The layout inference.prepare_model writes: transformers 5 "dtype", rope_parameters.
    found = inspect_model_dir(str(write_model(tmp_path / "m", config={
        "num_hidden_layers": 30, "num_key_value_heads": 3, "num_attention_heads": 9,
        "hidden_size": 576, "head_dim": 64, "max_position_embeddings": 8192,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})))
    assert (found.num_layers, found.num_attention_heads, found.num_kv_heads, found.head_dim,
            found.max_positions) == (30, 9, 3, 64, 8192)


@pytest.mark.parametrize(("config", "expected"), [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, 8192),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 4096),
    ({"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 4.0}}}, 16384),
    ({"max_position_embeddings": 4096, "n_positions": 1024}, 1024),
])
def test_max_positions_follows_vllms_rules(tmp_path: Path, config: dict[str, Any],
                                           expected: int) -> None:
    assert inspect_model_dir(str(write_model(tmp_path / "m", config=config))).max_positions == expected


def test_head_dim_and_kv_heads_default_like_transformers(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    del config["head_dim"], config["num_key_value_heads"]
    (model / "config.json").write_text(json.dumps(config))
    found = inspect_model_dir(str(model))
    assert (found.num_kv_heads, found.head_dim) == (4, 16)


def test_inspection_names_quantization_and_a_checkpoint_kv_scheme(tmp_path: Path) -> None:
    found = inspect_model_dir(str(write_model(tmp_path / "m", config={"quantization_config": {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
        "kv_cache_scheme": {"num_bits": 8, "type": "float"},
    }})))
    assert found.quantization == "compressed-tensors w4a16"
    assert (found.kv_dtype, found.kv_dtype_from_checkpoint) == ("fp8", True)
    gptq = inspect_model_dir(str(write_model(tmp_path / "g", config={
        "quantization_config": {"quant_method": "gptq", "bits": 4}})))
    assert gptq.quantization == "gptq 4-bit"


def _break(model: Path, how: str) -> None:
    if how == "no config":
        (model / "config.json").unlink()
    elif how == "config unreadable":
        (model / "config.json").unlink()
        (model / "config.json").mkdir()
    elif how == "config not json":
        (model / "config.json").write_text("{not json")
    elif how == "unsupported architecture":
        (model / "config.json").write_text(json.dumps({"architectures": ["WhisperForConditionalGeneration"]}))
    elif how == "no architecture":
        (model / "config.json").write_text("{}")
    elif how == "gguf":
        (model / "model.safetensors").unlink()
        (model / "model.Q4_1.gguf").write_bytes(b"GGUF")
    elif how == "no weights":
        (model / "model.safetensors").unlink()
    elif how == "bad safetensors":
        (model / "model.safetensors").write_bytes(b"\xff" * 16)
    elif how == "missing shard":
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
            "a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    elif how == "no tokenizer":
        (model / "tokenizer.json").unlink()
    elif how == "bad geometry":
        (model / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "num_hidden_layers": -2,
            "num_attention_heads": 4, "hidden_size": 64, "max_position_embeddings": 64}))


@pytest.mark.parametrize(("how", "message"), [
    ("no config", "missing config.json"),
    ("config unreadable", "cannot read config.json: Is a directory"),
    ("config not json", "config.json is not valid JSON"),
    ("unsupported architecture", "unsupported architecture WhisperForConditionalGeneration"),
    ("no architecture", "config.json names no architecture"),
    ("gguf", "GGUF checkpoints are not loaded by vLLM"),
    ("no weights", "no weight files (*.safetensors)"),
    ("bad safetensors", "model.safetensors is not a safetensors file"),
    ("missing shard", "missing weight file(s) named by model.safetensors.index.json: "
                      "model-00002-of-00002.safetensors"),
    ("no tokenizer", "no tokenizer"),
    ("bad geometry", "num_hidden_layers must be a positive integer, got -2"),
])
def test_bad_directories_get_clear_errors(tmp_path: Path, how: str, message: str) -> None:
    model = write_model(tmp_path / "m")
    _break(model, how)
    with pytest.raises(InspectionError) as excinfo:
        inspect_model_dir(str(model))
    assert message in str(excinfo.value)


@pytest.mark.parametrize(("path", "message"), [
    ("relative/model", "must be an absolute path"),
    ("/models/../etc", "must not contain '..'"),
    ("/no/such/model", "/no/such/model does not exist"),
])
def test_bad_paths_get_clear_errors(path: str, message: str) -> None:
    with pytest.raises(InspectionError, match=message):
        inspect_model_dir(path)


def test_every_supported_architecture_is_one_vllm_serves() -> None:
    # Importing vLLM's registry takes seconds, so the console keeps its own list; this holds
    # the list to the installed vLLM.
    script = ("from vllm.model_executor.models.registry import _VLLM_MODELS; "
              f"print(sorted(set({sorted(SUPPORTED_ARCHITECTURES)!r}) - set(_VLLM_MODELS)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


# ---- registration ---------------------------------------------------------------------------


@pytest.fixture
def tiny(db: None) -> BaseModel:
    return BaseModel.objects.create(name="tiny")


@pytest.fixture
def api(owner: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(owner)
    return client


def test_registering_over_the_api_fills_the_variant_in(api: APIClient, tiny: BaseModel,
                                                       tmp_path: Path) -> None:
    model = write_model(tmp_path / "bf16")
    response = api.post("/api/v1/variants/", {"base_model": "tiny", "name": "bf16",
                                              "path": str(model)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["base_model"] == "tiny"
    assert body["kv_geometry"] == {"num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
                                   "head_dim": 16,
                                   "kv_dtype": "bfloat16", "kv_dtype_from_checkpoint": False,
                                   "max_positions": 4096}
    assert body["hash"]["state"] == "queued"
    assert body["hash"]["bytes_total"] == (model / "model.safetensors").stat().st_size
    listed = api.get("/api/v1/variants/?base=tiny").json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]


@pytest.mark.parametrize(("path", "message"), [
    ("relative/dir", "must be an absolute path"),
    ("/models/../x", "must not contain '..'"),
    ("{tmp}/empty", "missing config.json"),
])
def test_registering_a_bad_directory_is_400_on_path(api: APIClient, tiny: BaseModel,
                                                    tmp_path: Path, path: str,
                                                    message: str) -> None:
    (tmp_path / "empty").mkdir()
    response = api.post("/api/v1/variants/", {"base_model": "tiny", "name": "x",
                                              "path": path.format(tmp=tmp_path)}, format="json")
    assert response.status_code == 400
    assert message in response.json()["path"][0]
    assert not Variant.objects.exists()


def test_registering_twice_is_refused(api: APIClient, tiny: BaseModel, tmp_path: Path) -> None:
    model = str(write_model(tmp_path / "bf16"))
    assert api.post("/api/v1/variants/", {"base_model": "tiny", "name": "bf16", "path": model},
                    format="json").status_code == 201
    again = api.post("/api/v1/variants/", {"base_model": "tiny", "name": "copy", "path": model},
                     format="json")
    assert again.status_code == 400 and "path" in again.json()
    same_name = api.post("/api/v1/variants/", {"base_model": "tiny", "name": "bf16",
                                               "path": str(write_model(tmp_path / "b"))},
                         format="json")
    assert same_name.status_code == 400
    assert Variant.objects.count() == 1


def test_base_models_are_created_and_listed(api: APIClient) -> None:
    assert api.post("/api/v1/models/", {"name": "qwen3-0.6b"}, format="json").status_code == 400
    assert api.post("/api/v1/models/", {"name": "qwen3-0-6b"}, format="json").status_code == 201
    assert api.post("/api/v1/models/", {"name": "qwen3-0-6b"}, format="json").status_code == 400
    assert [m["name"] for m in api.get("/api/v1/models/").json()["results"]] == ["qwen3-0-6b"]


def test_reinspecting_records_a_broken_directory(api: APIClient, tiny: BaseModel,
                                                 tmp_path: Path) -> None:
    variant = register_variant(tiny, "bf16", str(write_model(tmp_path / "bf16")))
    (tmp_path / "bf16" / "config.json").unlink()
    body = api.post(f"/api/v1/variants/{variant.pk}/inspect").json()
    assert "missing config.json" in body["inspection_error"]
    assert body["hash"]["state"] == "pending"


def test_ensure_variant_records_a_broken_directory_instead_of_failing(tiny: BaseModel,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    variant = ensure_variant(tiny, "bf16", str(tmp_path / "empty"))
    assert "missing config.json" in variant.inspection_error
    write_model(tmp_path / "empty")
    assert ensure_variant(tiny, "bf16", str(tmp_path / "empty")).inspected


def test_catalog_page_registers_and_shows_errors_on_the_field(owner: User, tiny: BaseModel,
                                                             tmp_path: Path) -> None:
    browser = Client()
    browser.force_login(owner)
    bad = browser.post("/models/register/", {"variant-base": tiny.pk, "variant-name": "bf16",
                                             "variant-path": str(tmp_path)})
    assert bad.status_code == 400
    assert "missing config.json" in bad.content.decode()
    good = browser.post("/models/register/", {"variant-base": tiny.pk, "variant-name": "bf16",
                                              "variant-path": str(write_model(tmp_path / "m"))})
    assert good.status_code == 302
    html = browser.get("/models/").content.decode()
    assert 'data-variant="tiny/bf16"' in html
    assert "2 layers × 2 KV heads × 16" in html


# ---- hashing in the background --------------------------------------------------------------


def _hashed(variant: Variant) -> Variant:
    assert hash_weights(variant.pk, variant.hash_job)
    return Variant.objects.get(pk=variant.pk)


def test_hashing_computes_the_sha256_of_the_weight_files(tiny: BaseModel, tmp_path: Path) -> None:
    model = write_model(tmp_path / "m", weights_fill=3)
    variant = _hashed(register_variant(tiny, "bf16", str(model)))
    digest = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert variant.hash_state == State.DONE
    assert variant.file_hashes == {"model.safetensors": digest}
    assert variant.weights_sha256 == combined_sha256({"model.safetensors": digest})
    assert (variant.hash_percent, variant.hash_bytes_done) == (100, variant.hash_bytes_total)


def test_hashing_reports_progress_as_it_goes(tiny: BaseModel, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model(tmp_path / "m")
    (model / "model.safetensors").write_bytes(safetensors_bytes({"w": ("BF16", [1024, 1024])}))
    variant = register_variant(tiny, "bf16", str(model))
    monkeypatch.setattr("console.catalog.hashing.CHUNK_BYTES", 256 * 1024)
    monkeypatch.setattr("console.catalog.hashing.PROGRESS_EVERY_S", 0.0)
    reported: list[int] = []
    update = QuerySet.update

    def recording_update(queryset: QuerySet, **fields: Any) -> int:
        if queryset.model is Variant and "hash_bytes_done" in fields:
            reported.append(fields["hash_bytes_done"])
        return update(queryset, **fields)

    monkeypatch.setattr(QuerySet, "update", recording_update)
    hash_weights(variant.pk, variant.hash_job)
    total = Variant.objects.get(pk=variant.pk).hash_bytes_total
    assert reported[0] == 0 and reported[-1] == total
    assert [n for n in reported if 0 < n < total], reported  # progress in between
    assert reported == sorted(reported)


def test_a_superseded_hashing_job_writes_nothing(tiny: BaseModel, tmp_path: Path) -> None:
    variant = register_variant(tiny, "bf16", str(write_model(tmp_path / "m")))
    old_job = variant.hash_job
    reinspect(variant)
    assert hash_weights(variant.pk, old_job) is False
    assert Variant.objects.get(pk=variant.pk).hash_state == State.QUEUED


def test_hashing_fails_clearly_when_files_change(tiny: BaseModel, tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    variant = register_variant(tiny, "bf16", str(model))
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    variant = _hashed(variant)
    assert variant.hash_state == State.FAILED
    assert "model.safetensors changed since it was inspected" in variant.hash_error


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Celery runs tasks in the caller: the test database is in memory, out of a worker's reach."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.mark.usefixtures("eager_celery")
def test_registration_queues_the_hashing_task_after_commit(
    tiny: BaseModel, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        variant = register_variant(tiny, "bf16", str(write_model(tmp_path / "m")))
        assert Variant.objects.get(pk=variant.pk).hash_state == State.QUEUED
    assert len(callbacks) == 1
    variant.refresh_from_db()
    assert variant.hash_state == State.DONE
    assert len(variant.weights_sha256) == 64
