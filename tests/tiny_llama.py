"""A random-weight Llama small enough that vLLM starts it in well under a minute on this CPU,
with SmolLM2's real tokenizer and chat template, for tests about processes, files and kernels
rather than text."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")


def build_tiny_llama(source: Path, out: Path, *, layers: int = 2, dtype: str = "float32",
                     seed: int = 0) -> Path:
    """Write a Llama of ``layers`` layers (hidden 128, head dim 64: every dim a multiple of 64,
    as vLLM's CPU W4A16 kernel needs multiples of 32) with SmolLM2's vocabulary to ``out``, and
    the tokenizer files of ``source`` (the default model's directory) beside it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, out / name)
    return out
