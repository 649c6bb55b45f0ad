"""A random-weight Llama small enough that vLLM starts it in well under a minute on this CPU,
with SmolLM2's real tokenizer and chat template, for tests about processes, files and kernels
rather than text."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Every vLLM server the tests start keeps its caches here, as the workers of one node share
# the console's PDSERVE_CACHE_DIR: a server whose configuration another test already compiled
# skips the torch.compile warm-up, and every server after the first skips the model registry's
# inspection (together 20-60 s a start on this CPU).
TEST_CACHE_DIR = Path(os.environ.get("PDSERVE_CACHE_DIR", REPO / "data" / "cache"))
# The 2-layer float32 tiny model tests share, at one path: vLLM's compile cache is keyed on the
# model's path, so one path lets each server reuse what the first compiled.
SHARED_TINY = REPO / "data" / "models" / "tiny-llama-2l"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")


def build_tiny_llama(source: Path, out: Path, *, layers: int = 2, dtype: str = "float32",
                     seed: int = 0, tied: bool = True) -> Path:
    """Write a Llama of ``layers`` layers (hidden 128, head dim 64: every dim a multiple of 64,
    as vLLM's CPU W4A16 kernel needs multiples of 32) with SmolLM2's vocabulary to ``out``, and
    the tokenizer files of ``source`` (the default model's directory) beside it.

    Tied embeddings make a random model repeat the prompt's last token, whatever its seed;
    ``tied=False`` gives one whose greedy answers depend on its weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=2048, tie_word_embeddings=tied,
                         bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, out / name)
    return out


def shared_tiny_llama(source: Path) -> Path:
    """The 2-layer float32 tiny model at :data:`SHARED_TINY`, built once (written beside it and
    renamed, so an interrupted build leaves no half model at that path)."""
    if (SHARED_TINY / "model.safetensors").is_file():
        return SHARED_TINY
    SHARED_TINY.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=SHARED_TINY.parent))
    build_tiny_llama(source, partial)
    partial.rename(SHARED_TINY)
    return SHARED_TINY
