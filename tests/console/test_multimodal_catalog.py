"""Issue 28, the catalog: a vision-language model is recognised, its text model's geometry read
from text_config, and its modalities, processor configuration and vision encoder recorded; a
text model is recorded as text only."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from console.catalog.inspection import (
    MULTIMODAL_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    combined_sha256,
    inspect_model_dir,
)
from console.catalog.models import BaseModel
from tests.console.tiny_models import write_model

pytestmark = pytest.mark.django_db

ARCHITECTURES = {"tiny-idefics3": "Idefics3ForConditionalGeneration",
                 "tiny-paddleocr-vl": "PaddleOCRVLForConditionalGeneration"}
# The tensors of each tiny VLM's vision tower and projector, by their first name components.
ENCODER_TENSORS = {"tiny-idefics3": ("model.vision_model.", "model.connector."),
                   "tiny-paddleocr-vl": ("visual.", "mlp_AR.")}


def tensor_counts(model: Path) -> dict[str, int]:
    """Each tensor's parameter count, read from the safetensors header by hand."""
    with (model / "model.safetensors").open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {name: math.prod(info["shape"]) for name, info in header.items()
            if name != "__metadata__"}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_a_tiny_vlm_is_inspected_with_its_text_models_geometry(
        tiny_vlms: dict[str, Path], name: str) -> None:
    model = tiny_vlms[name]
    config = json.loads((model / "config.json").read_text())
    text = config["text_config"]
    # The geometry is text_config's alone: config.json's top level has none of it.
    assert "num_attention_heads" not in config and "num_hidden_layers" not in config
    found = inspect_model_dir(str(model))
    assert found.architecture == ARCHITECTURES[name]
    assert (found.num_layers, found.num_attention_heads, found.num_kv_heads, found.head_dim,
            found.max_positions) == (text["num_hidden_layers"], text["num_attention_heads"],
                                     text["num_key_value_heads"], text["head_dim"],
                                     text["max_position_embeddings"])
    assert (found.num_layers, found.num_kv_heads, found.head_dim) == (2, 1, 64)
    assert found.modalities == ["text", "image"]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_a_tiny_vlm_records_its_processor_and_vision_encoder(
        tiny_vlms: dict[str, Path], name: str) -> None:
    model = tiny_vlms[name]
    found = inspect_model_dir(str(model))
    # What the directory holds of the processor's configuration, hashed as canonical JSON.
    canonical = json.dumps(json.loads((model / "processor_config.json").read_text()),
                           sort_keys=True).encode()
    assert found.processor_files == {
        "processor_config.json": hashlib.sha256(canonical).hexdigest()}
    assert found.processor_sha256 == combined_sha256(found.processor_files)
    counts = tensor_counts(model)
    encoder = sum(n for t, n in counts.items() if t.startswith(ENCODER_TENSORS[name]))
    assert 0 < found.encoder_parameter_count == encoder < found.parameter_count
    assert found.parameter_count == sum(counts.values())  # the encoder is inside, once


def test_a_reindented_processor_config_is_the_same_processor_and_a_changed_one_is_not(
        tiny_vlms: dict[str, Path], tmp_path: Path) -> None:
    model = copy_model(tiny_vlms["tiny-idefics3"], tmp_path / "copy")
    before = inspect_model_dir(str(model)).processor_sha256
    config = json.loads((model / "processor_config.json").read_text())
    (model / "processor_config.json").write_text(json.dumps(config, indent=7))
    assert inspect_model_dir(str(model)).processor_sha256 == before
    config["image_processor"]["size"] = {"longest_edge": 112}
    (model / "processor_config.json").write_text(json.dumps(config))
    assert inspect_model_dir(str(model)).processor_sha256 != before
    (model / "preprocessor_config.json").write_text(json.dumps({"do_resize": True}))
    assert set(inspect_model_dir(str(model)).processor_files) == {
        "preprocessor_config.json", "processor_config.json"}


def test_a_text_model_takes_text_only(tmp_path: Path) -> None:
    found = inspect_model_dir(str(write_model(tmp_path / "llama")))
    assert (found.modalities, found.processor_sha256, found.processor_files,
            found.encoder_parameter_count) == (["text"], "", {}, 0)


def test_the_vlm_architectures_are_supported_and_llava_is_not() -> None:
    assert set(MULTIMODAL_ARCHITECTURES) == set(ARCHITECTURES.values())
    assert set(MULTIMODAL_ARCHITECTURES) <= SUPPORTED_ARCHITECTURES
    # Their processors need torchvision, which has only CUDA builds on this package index.
    assert not {"LlavaForConditionalGeneration", "Qwen2VLForConditionalGeneration"} & \
        SUPPORTED_ARCHITECTURES


def test_the_api_and_the_catalog_page_show_modalities(
        api: APIClient, owner: User, tiny_vlms: dict[str, Path], tmp_path: Path) -> None:
    BaseModel.objects.create(name="tiny-vlm")
    response = api.post("/api/v1/variants/", {"base_model": "tiny-vlm", "name": "f32",
                                              "path": str(tiny_vlms["tiny-paddleocr-vl"])},
                        format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    found = inspect_model_dir(str(tiny_vlms["tiny-paddleocr-vl"]))
    assert body["modalities"] == ["text", "image"]
    assert body["kv_geometry"]["num_kv_heads"] == 1
    assert (body["processor_sha256"], body["processor_files"],
            body["encoder_parameter_count"]) == (found.processor_sha256, found.processor_files,
                                                 found.encoder_parameter_count)
    BaseModel.objects.create(name="tiny")
    text = api.post("/api/v1/variants/", {"base_model": "tiny", "name": "bf16",
                                          "path": str(write_model(tmp_path / "llama"))},
                    format="json").json()
    assert (text["modalities"], text["encoder_parameter_count"]) == (["text"], 0)

    browser = Client()
    browser.force_login(owner)
    html = browser.get("/models/").content.decode()
    assert "text + image" in html
    assert f"vision encoder {found.encoder_parameter_count} parameters" in html


def copy_model(source: Path, out: Path) -> Path:
    """A copy of ``source`` to change: its small files copied, its weights linked."""
    out.mkdir(parents=True)
    for file in source.iterdir():
        if file.name == "model.safetensors":
            (out / file.name).symlink_to(file)
        else:
            (out / file.name).write_bytes(file.read_bytes())
    return out
