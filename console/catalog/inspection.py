"""Reading a model directory: what a worker would load, without loading it.

Everything comes from small files (config.json, tokenizer and processor files,
generation_config.json) and the JSON headers of the safetensors files, so inspecting a multi-GB
checkpoint takes milliseconds. Hashing the weights themselves is a background job
(``console.catalog.hashing``).

A vision-language model keeps its text model's geometry in config.json's ``text_config``: the
KV geometry and the context length are read from there, and its vision tower's parameters are
counted apart (``encoder_parameter_count``, from the tensor names in the safetensors headers).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from console.catalog.vision_models import (
    MULTIMODAL_ARCHITECTURES,
    PROCESSOR_FILES,
    is_encoder_tensor,
)

# Decoder-only architectures with standard (multi-head or grouped-query) attention, whose KV
# geometry is layers x KV heads x head dim as config.json (a VLM's text_config) states it. All
# are in vLLM's model registry (tests/console/test_catalog.py holds the list to that).
SUPPORTED_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GemmaForCausalLM",
    "Gemma2ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM", "OlmoForCausalLM",
    "Olmo2ForCausalLM", "StableLmForCausalLM", "Starcoder2ForCausalLM", "CohereForCausalLM",
    *MULTIMODAL_ARCHITECTURES,
})

# Keys vLLM reads a model's maximum length from; it takes the smallest present.
MAX_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                   "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings already includes the scaling (vLLM 0.32,
# config/model.py _get_and_verify_max_len).
ROPE_TYPES_WITHOUT_FACTOR = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn",
                                       "deepseek_llama_scaling"})

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "special_tokens_map.json", "added_tokens.json")
TOKENIZER_VOCABULARIES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# tokenizer_config.json keys that say how or where a tokenizer was saved, not how it splits
# text: a quantized copy saved by another transformers version differs only in these.
TOKENIZER_CONFIG_IGNORED = frozenset({"chat_template", "model_max_length", "is_local",
                                      "local_files_only", "name_or_path", "_commit_hash",
                                      "transformers_version"})

SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32"}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


class InspectionError(ValueError):
    """A directory that is not a servable model; the message says what is wrong."""


@dataclass(frozen=True)
class WeightFile:
    name: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ModelInspection:
    architecture: str
    dtype: str
    quantization: str  # "" when unquantized
    num_attention_heads: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    kv_dtype_from_checkpoint: bool  # a quantization scheme fixes the KV cache dtype
    max_positions: int
    parameter_count: int
    size_bytes: int
    weight_files: list[WeightFile]
    tokenizer_sha256: str
    tokenizer_files: dict[str, str]
    chat_template_sha256: str  # "" when the model ships none
    generation_config: dict[str, Any] = field(default_factory=dict)
    modalities: list[str] = field(default_factory=lambda: ["text"])
    processor_sha256: str = ""  # "" when the directory holds no processor configuration
    processor_files: dict[str, str] = field(default_factory=dict)
    encoder_parameter_count: int = 0  # the vision tower's, with its connector (in parameter_count)


def inspect_model_dir(path: str) -> ModelInspection:
    root = _directory(path)
    config = _read_json(root, "config.json", required=True)
    architecture = _architecture(config)
    multimodal = architecture in MULTIMODAL_ARCHITECTURES
    weights, parameter_count, tensor_dtype, encoder_parameters = _weights(root)
    tokenizer_config = _read_json(root, "tokenizer_config.json", required=False)
    dtype = _dtype(config, tensor_dtype)
    quantization, kv_scheme_dtype = _quantization(config)
    tokenizer_files = _tokenizer_hashes(root, tokenizer_config)
    processor_files = _processor_hashes(root)
    text = _text_config(config)
    return ModelInspection(
        architecture=architecture,
        dtype=dtype,
        quantization=quantization,
        num_attention_heads=_positive_int(text, "num_attention_heads"),
        num_layers=_positive_int(text, "num_hidden_layers"),
        num_kv_heads=_positive_int(text, "num_key_value_heads",
                                   default=_positive_int(text, "num_attention_heads")),
        head_dim=_head_dim(text),
        kv_dtype=kv_scheme_dtype or dtype,
        kv_dtype_from_checkpoint=bool(kv_scheme_dtype),
        max_positions=_max_positions(text, tokenizer_config),
        parameter_count=parameter_count,
        size_bytes=_directory_size(root),
        weight_files=weights,
        tokenizer_sha256=_combined(tokenizer_files),
        tokenizer_files=tokenizer_files,
        chat_template_sha256=_chat_template_hash(root, tokenizer_config),
        generation_config=_read_json(root, "generation_config.json", required=False),
        modalities=["text", *MULTIMODAL_ARCHITECTURES.get(architecture, ())],
        processor_sha256=_combined(processor_files) if processor_files else "",
        processor_files=processor_files,
        encoder_parameter_count=encoder_parameters if multimodal else 0,
    )


def combined_sha256(file_hashes: dict[str, str]) -> str:
    """One digest for a set of files: the sha256 of their ``sha256sum`` listing, sorted by name."""
    return _combined(file_hashes)


def _combined(file_hashes: dict[str, str]) -> str:
    listing = "".join(f"{digest}  {name}\n" for name, digest in sorted(file_hashes.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def _directory(path: str) -> Path:
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        raise InspectionError(f"must be an absolute path, got {path!r}")
    if ".." in pure.parts:
        raise InspectionError(f"must not contain '..', got {path!r}")
    root = Path(path)
    if not root.exists():
        raise InspectionError(f"{path} does not exist")
    if not root.is_dir():
        raise InspectionError(f"{path} is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise InspectionError(f"cannot read {path}: permission denied")
    return root


def _read_json(root: Path, name: str, *, required: bool) -> dict[str, Any]:
    file = root / name
    if not file.exists():
        if required:
            raise InspectionError(f"missing {name} in {root}: not a Hugging Face model directory")
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InspectionError(f"cannot read {name}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InspectionError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InspectionError(f"{name} must hold a JSON object")
    return data


def _architecture(config: dict[str, Any]) -> str:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise InspectionError("config.json names no architecture ('architectures' is missing)")
    architecture = str(architectures[0])
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise InspectionError(
            f"unsupported architecture {architecture}: pdserve serves decoder-only models with "
            f"standard attention ({', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    return architecture


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's settings: a vision-language model's ``text_config`` (as vLLM's
    hf_text_config reads it), else config.json's top level. Keys it lacks (a model's dtype,
    say) fall back to the top level."""
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise InspectionError("config.json: text_config must be a JSON object")
    return {**config, **text}


def _positive_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        where = "text_config" if "text_config" in config else "config.json"
        raise InspectionError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _head_dim(config: dict[str, Any]) -> int:
    if config.get("head_dim") is not None:
        return _positive_int(config, "head_dim")
    hidden, heads = _positive_int(config, "hidden_size"), _positive_int(config, "num_attention_heads")
    if hidden % heads:
        raise InspectionError(f"config.json: hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads}, and head_dim is not given")
    return hidden // heads


def _max_positions(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    lengths = [config[key] for key in MAX_LENGTH_KEYS
               if isinstance(config.get(key), int) and not isinstance(config.get(key), bool)]
    if not lengths:
        raise InspectionError("config.json states no maximum length "
                              f"(none of {', '.join(MAX_LENGTH_KEYS)})")
    derived = float(min(lengths))
    if "gemma3" not in str(config.get("model_type", "")):
        for rope in _rope_parameters(config):
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            factor = rope.get("factor")
            if rope_type not in ROPE_TYPES_WITHOUT_FACTOR and isinstance(factor, int | float):
                derived *= factor
                break
    tokenizer_limit = tokenizer_config.get("model_max_length")
    if isinstance(tokenizer_limit, int | float) and math.isfinite(tokenizer_limit):
        derived = min(derived, tokenizer_limit)
    return int(derived)


def _rope_parameters(config: dict[str, Any]) -> list[dict[str, Any]]:
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    if not isinstance(rope, dict):
        return []
    if "rope_type" in rope or "type" in rope:
        return [rope]
    # transformers 5 keys RoPE settings by layer type, e.g. {"full_attention": {...}}.
    return [value for value in rope.values() if isinstance(value, dict)]


def _weights(root: Path) -> tuple[list[WeightFile], int, str, int]:
    """The weight files (checked against the shard index), parameter count, main tensor dtype,
    and the parameters of tensors named as a vision tower's (``vision_models.ENCODER_PREFIXES``)."""
    names = sorted(p.name for p in root.glob("*.safetensors"))
    if not names:
        if any(root.glob("*.gguf")):
            raise InspectionError("GGUF checkpoints are not loaded by vLLM 0.32: convert to "
                                  "safetensors first (python -m inference.prepare_model --help)")
        if any(root.glob("*.bin")) or any(root.glob("*.pt")):
            raise InspectionError("PyTorch .bin/.pt weights are not supported: save the model "
                                  "as safetensors (save_pretrained(..., safe_serialization=True))")
        raise InspectionError(f"no weight files (*.safetensors) in {root}")
    index = _read_json(root, "model.safetensors.index.json", required=False)
    if index:
        shards = sorted(set((index.get("weight_map") or {}).values()))
        missing = [shard for shard in shards if shard not in names]
        if missing:
            raise InspectionError(f"missing weight file(s) named by model.safetensors.index.json: "
                                  f"{', '.join(missing)}")
        names = shards
    files, parameters, encoder, dtypes = [], 0, 0, Counter[str]()
    for name in names:
        path = root / name
        try:
            stat = path.stat()
            header = _safetensors_header(path)
        except OSError as exc:
            raise InspectionError(f"cannot read {name}: {exc.strerror or exc}") from exc
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            count = math.prod(info.get("shape") or [1])
            parameters += count
            encoder += count if is_encoder_tensor(tensor) else 0
            dtypes[str(info.get("dtype"))] += count
        files.append(WeightFile(name=name, size=stat.st_size, mtime_ns=stat.st_mtime_ns))
    floats = [dtype for dtype, _ in dtypes.most_common() if dtype in SAFETENSORS_DTYPES]
    return files, parameters, SAFETENSORS_DTYPES[floats[0]] if floats else "", encoder


def _safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise InspectionError(f"{path.name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_SAFETENSORS_HEADER:
            raise InspectionError(f"{path.name} is not a safetensors file (header of {length} bytes)")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InspectionError(f"{path.name} is not a safetensors file: {exc}") from exc
    if not isinstance(header, dict):
        raise InspectionError(f"{path.name} is not a safetensors file (header is not an object)")
    return header


def _dtype(config: dict[str, Any], tensor_dtype: str) -> str:
    # transformers 5 writes "dtype"; earlier versions wrote "torch_dtype".
    raw = config.get("dtype") or config.get("torch_dtype") or tensor_dtype
    if not raw:
        raise InspectionError("cannot tell the weights' dtype: config.json has no dtype and "
                              "no floating-point tensor was found")
    name = str(raw).removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


def _quantization(config: dict[str, Any]) -> tuple[str, str]:
    """``(label, KV dtype the checkpoint fixes)``; ``("", "")`` for an unquantized model."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return "", ""
    method = str(quant.get("quant_method", "unknown"))
    label = method
    if method == "compressed-tensors":
        label = f"{method} {_compressed_tensors_scheme(quant)}".strip()
    elif isinstance(quant.get("bits"), int):
        label = f"{method} {quant['bits']}-bit"
    kv_scheme = quant.get("kv_cache_scheme")
    kv_dtype = ""
    if isinstance(kv_scheme, dict):
        # vLLM 0.32 turns a checkpoint's KV cache scheme into an fp8 cache when the KV dtype
        # is left on "auto" (layers/attention/attention.py).
        kv_dtype = "fp8"
    return label, kv_dtype


def _compressed_tensors_scheme(quant: dict[str, Any]) -> str:
    for group in (quant.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        activations = (group or {}).get("input_activations") or {}
        bits = weights.get("num_bits")
        if not isinstance(bits, int):
            continue
        if weights.get("type") == "float":
            return f"fp{bits}"
        return f"w{bits}a{activations.get('num_bits') or 16}"
    return ""


def _tokenizer_hashes(root: Path, tokenizer_config: dict[str, Any]) -> dict[str, str]:
    if not any((root / name).is_file() for name in TOKENIZER_VOCABULARIES):
        raise InspectionError(f"no tokenizer ({' or '.join(TOKENIZER_VOCABULARIES)}) in {root}: "
                              "vLLM reads the tokenizer from the model directory")
    hashes = {}
    for name in TOKENIZER_FILES:
        file = root / name
        if not file.is_file():
            continue
        if name == "tokenizer_config.json":
            relevant = {k: v for k, v in tokenizer_config.items() if k not in TOKENIZER_CONFIG_IGNORED}
            hashes[name] = _sha256_text(json.dumps(relevant, sort_keys=True))
        elif name == "tokenizer.json":
            # Canonical JSON: a re-save that only reorders keys or re-indents is the same tokenizer.
            hashes[name] = _sha256_text(json.dumps(_read_json(root, name, required=True),
                                                   sort_keys=True))
        else:
            hashes[name] = _sha256_file(file)
    return hashes


def _processor_hashes(root: Path) -> dict[str, str]:
    """sha256 of each processor configuration file present, of its canonical JSON: a re-save
    that only reorders keys or re-indents is the same processor."""
    return {name: _sha256_text(json.dumps(_read_json(root, name, required=True), sort_keys=True))
            for name in PROCESSOR_FILES if (root / name).is_file()}


def _chat_template_hash(root: Path, tokenizer_config: dict[str, Any]) -> str:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return _sha256_file(jinja)
    template = _read_json(root, "chat_template.json", required=False).get("chat_template")
    if template is None:
        template = tokenizer_config.get("chat_template")
    if template is None:
        return ""
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return _sha256_text(text)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as exc:
        raise InspectionError(f"cannot read {path.name}: {exc.strerror or exc}") from exc


def _directory_size(root: Path) -> int:
    return sum(entry.stat().st_size for entry in root.iterdir() if entry.is_file())
