"""What to build, checked against the model's config.json before anything heavy is imported."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.quantization.device import fp8_device

SCHEMES = ("w8a8-int8", "w4a16", "fp8")
METHODS = ("gptq", "rtn")
DEFAULT_METHOD = "gptq"
DEFAULT_GROUP_SIZE = 64
DEFAULT_SMOOTHING_STRENGTH = 0.8
DEFAULT_SAMPLES = 40
DEFAULT_MAX_SEQ_LEN = 128
# lm_head stays in full precision: it is small next to the layers and the logits are sensitive.
IGNORED_MODULES = ("lm_head",)

# Dense decoder-only architectures that llmcompressor's sequential pipeline traces layer by
# layer and vLLM serves from compressed-tensors checkpoints. Mixture-of-experts models are left
# out: calibrating their experts needs routing-aware handling this builder does not do.
# LlamaForCausalLM is the one exercised by pdserve's tests.
QUANTIZABLE_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "GemmaForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM", "GraniteForCausalLM",
    "OlmoForCausalLM", "Olmo2ForCausalLM", "StableLmForCausalLM", "Starcoder2ForCausalLM",
    "CohereForCausalLM",
})


class OptionError(ValueError):
    """Bad input; ``flag`` names the command-line flag at fault."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag


@dataclass(frozen=True)
class BuildOptions:
    model: Path
    out: Path
    scheme: str
    method: str
    group_size: int | None  # w4a16 only
    smoothing_strength: float | None  # w8a8-int8 with gptq only; None = no SmoothQuant
    samples: int
    max_seq_len: int
    calibration: Path

    @property
    def label(self) -> str:
        """A short description for logs and the provenance file, e.g. 'w4a16 gptq g64'."""
        parts = [self.scheme, self.method]
        if self.group_size:
            parts.append(f"g{self.group_size}")
        if self.smoothing_strength:
            parts.append(f"smoothquant {self.smoothing_strength:g}")
        return " ".join(parts)

    @property
    def needs_calibration(self) -> bool:
        return self.method == "gptq"


def resolve(*, model: Path, out: Path, scheme: str, method: str | None, group_size: int | None,
            smoothing_strength: float | None, samples: int, max_seq_len: int,
            calibration: Path) -> BuildOptions:
    """Check every option against each other and the model; raise OptionError naming the flag."""
    config = read_config(model)
    check_architecture(config)
    if scheme not in SCHEMES:
        raise OptionError("--scheme", f"{scheme!r} is not one of {', '.join(SCHEMES)}")
    method = method or default_method(scheme)
    if method not in METHODS:
        raise OptionError("--method", f"{method!r} is not one of {', '.join(METHODS)}")
    if scheme == "fp8":
        supported, device = fp8_device()
        if not supported:
            raise OptionError("--scheme", f"fp8 is not served on this device ({device}): vLLM's FP8 "
                                          "kernels need an NVIDIA GPU of compute capability 8.9 or "
                                          "newer; on a CPU use w8a8-int8")
        if method != "rtn":
            raise OptionError("--method", "fp8 is built with dynamic per-token scales: use --method rtn")
    if scheme == "w4a16":
        group_size = check_group_size(config, DEFAULT_GROUP_SIZE if group_size is None else group_size)
    elif group_size is not None:
        raise OptionError("--group-size", f"only applies to --scheme w4a16, not {scheme}")
    if smoothing_strength is not None and not (scheme == "w8a8-int8" and method == "gptq"):
        raise OptionError("--smoothing-strength",
                          "SmoothQuant needs calibration: only with --scheme w8a8-int8 --method gptq")
    if scheme == "w8a8-int8" and method == "gptq":
        strength = DEFAULT_SMOOTHING_STRENGTH if smoothing_strength is None else smoothing_strength
        if not 0 <= strength < 1:
            raise OptionError("--smoothing-strength", f"must be in [0, 1), got {strength:g}")
        smoothing_strength = strength or None
    if not 1 <= samples <= 1024:
        raise OptionError("--samples", f"must be between 1 and 1024, got {samples}")
    if not 8 <= max_seq_len <= 8192:
        raise OptionError("--max-seq-len", f"must be between 8 and 8192, got {max_seq_len}")
    if not calibration.is_file():
        raise OptionError("--calibration", f"no such file: {calibration}")
    check_out(out)
    return BuildOptions(model=model, out=out, scheme=scheme, method=method, group_size=group_size,
                        smoothing_strength=smoothing_strength, samples=samples,
                        max_seq_len=max_seq_len, calibration=calibration)


def default_method(scheme: str) -> str:
    # fp8 needs no calibration: dynamic per-token activation scales, per-channel weights.
    return "rtn" if scheme == "fp8" else DEFAULT_METHOD


def read_config(model: Path) -> dict[str, Any]:
    config_file = model / "config.json"
    if not model.is_dir():
        raise OptionError("--model", f"{model} is not a directory")
    if not config_file.is_file():
        raise OptionError("--model", f"no config.json in {model}: not a Hugging Face model directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OptionError("--model", f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise OptionError("--model", f"{config_file} must hold a JSON object")
    if config.get("quantization_config"):
        method = (config["quantization_config"] or {}).get("quant_method", "unknown")
        raise OptionError("--model", f"{model} is already quantized ({method}); "
                                     "quantize the unquantized (bf16/fp16/fp32) checkpoint")
    return config


def check_architecture(config: dict[str, Any]) -> str:
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise OptionError("--model", "config.json names no architecture ('architectures' is missing)")
    architecture = str(architectures[0])
    if architecture not in QUANTIZABLE_ARCHITECTURES:
        raise OptionError(
            "--model",
            f"architecture {architecture} is not supported for quantization: pdserve quantizes "
            f"dense decoder-only models that llmcompressor calibrates layer by layer and vLLM "
            f"serves as compressed-tensors ({', '.join(sorted(QUANTIZABLE_ARCHITECTURES))})")
    return architecture


def group_size_dims(config: dict[str, Any]) -> dict[str, int]:
    """Input widths of the quantized Linear layers, which a group size must divide."""
    hidden = config.get("hidden_size")
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (hidden // heads if hidden and heads else None)
    dims = {"hidden_size": hidden, "intermediate_size": config.get("intermediate_size"),
            "num_attention_heads x head_dim": heads * head_dim if heads and head_dim else None}
    return {name: value for name, value in dims.items() if isinstance(value, int) and value > 0}


def check_group_size(config: dict[str, Any], group_size: int) -> int:
    # vLLM's CPU W4A16 kernel (CPUWNA16) takes even group sizes only.
    if group_size <= 0 or group_size % 2:
        raise OptionError("--group-size", f"must be a positive even number, got {group_size}")
    bad = {name: value for name, value in group_size_dims(config).items() if value % group_size}
    if bad:
        listed = ", ".join(f"{name} {value}" for name, value in bad.items())
        divisors = common_even_divisors(list(group_size_dims(config).values()))
        raise OptionError("--group-size",
                          f"{group_size} does not divide {listed}; this model takes "
                          f"{', '.join(map(str, divisors[-4:])) or 'no even group size'}")
    return group_size


def common_even_divisors(values: list[int]) -> list[int]:
    if not values:
        return []
    smallest = min(values)
    return [d for d in range(2, smallest + 1, 2) if all(v % d == 0 for v in values)]


def check_out(out: Path) -> None:
    if out.exists():
        raise OptionError("--out", f"{out} already exists; choose another directory or remove it")
    if not out.parent.is_dir():
        raise OptionError("--out", f"the parent directory {out.parent} does not exist")
