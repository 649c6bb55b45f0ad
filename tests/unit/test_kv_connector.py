"""pdserve's shared-storage connector (inference/kv_connectors/shared_storage.py) when saving
fails: the folder is dropped and never matched, so decode computes the prompt instead of
loading half a key. Real vLLM save code and real safetensors files in a temporary directory;
only the connector's construction (which needs a whole engine config) is skipped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnectorMetadata,
)

from inference.kv_connectors.shared_storage import COMPLETE, PdserveSharedStorageConnector

BLOCK = 4
PROMPT = list(range(100, 110))  # keyed by its first two blocks, as prefill and decode both see it
LAYERS = ("layer.0", "layer.1", "layer.2")


def connector(storage: Path) -> PdserveSharedStorageConnector:
    made = object.__new__(PdserveSharedStorageConnector)
    made._block_size = BLOCK
    made._storage_path = str(storage)
    made._requests_need_load = {}
    metadata = ExampleConnectorMetadata()
    metadata.add_request(token_ids=PROMPT, block_ids=[0, 1, 2], block_size=BLOCK, is_store=True,
                         mm_hashes=[])
    made.bind_connector_metadata(metadata)
    return made


def forward_step(made: PdserveSharedStorageConnector) -> None:
    """What vLLM's forward pass does with the connector: every layer saved, then wait_for_save."""
    kv = torch.zeros(3, 2, BLOCK, 8)  # [blocks, K/V, block size, head dim]
    for layer in LAYERS:
        made.save_kv_layer(layer, kv, None)
    made.wait_for_save()


def test_a_clean_save_is_matched(tmp_path: Path) -> None:
    made = connector(tmp_path)
    forward_step(made)
    [folder] = tmp_path.iterdir()
    assert {p.name for p in folder.iterdir()} == {*(f"{n}.safetensors" for n in LAYERS), COMPLETE}
    assert made._found_match_for_prompt(PROMPT, [])


def test_a_folder_without_its_marker_is_not_matched(tmp_path: Path) -> None:
    # What a prefill engine that died mid-save (before this fix: any failed save) leaves.
    made = connector(tmp_path)
    forward_step(made)
    [folder] = tmp_path.iterdir()
    (folder / COMPLETE).unlink()
    assert not made._found_match_for_prompt(PROMPT, [])


def test_a_save_failing_midway_drops_the_folder_and_logs_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = safetensors.torch.save_file
    calls: list[str] = []

    def full_after_one_layer(tensors: dict[str, Any], filename: str) -> None:
        calls.append(filename)
        if len(calls) > 1:
            raise SafetensorError("Error while serializing: I/O error: No space left on device")
        real(tensors, filename)

    monkeypatch.setattr(safetensors.torch, "save_file", full_after_one_layer)
    made = connector(tmp_path)
    with caplog.at_level(logging.WARNING):
        forward_step(made)
    assert len(calls) == 2  # the layers after the failure are not tried
    assert list(tmp_path.iterdir()) == []
    assert not made._found_match_for_prompt(PROMPT, [])
    assert "No space left on device" in caplog.text and str(tmp_path) in caplog.text


def test_a_storage_path_that_is_a_file_fails_no_step(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    storage = tmp_path / "kv"
    storage.write_text("not a directory")
    made = connector(storage)
    with caplog.at_level(logging.WARNING):
        forward_step(made)
    assert storage.read_text() == "not a directory"
    assert not made._found_match_for_prompt(PROMPT, [])
    assert "KV not saved" in caplog.text
