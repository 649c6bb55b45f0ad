"""Building a quantized variant with llmcompressor. Imports torch lazily: run it in .venv-quant.

The checkpoint is written into ``output.partial_dir(out)`` and renamed to ``out`` only when it
is complete, so an interrupted build leaves nothing that looks like a variant.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from inference.quantization.calibration import pick, read_samples
from inference.quantization.options import IGNORED_MODULES, BuildOptions
from inference.quantization.output import PROVENANCE_FILE, copy_companions, partial_dir
from inference.quantization.progress import Reporter

log = logging.getLogger("pdserve.quantize")


class BuildError(RuntimeError):
    """The build failed for a reason the user can act on; the message says which."""


def build(options: BuildOptions, reporter: Reporter) -> dict[str, Any]:
    """Write the variant at ``options.out`` and return facts about it (for the done event)."""
    started = time.monotonic()
    partial = partial_dir(options.out)
    try:
        partial.mkdir()
    except FileExistsError as exc:
        raise BuildError(f"{partial} exists: another build of {options.out.name} is running, or a "
                         "killed one left it behind (remove it to build again)") from exc
    try:
        facts = _build_into(options, partial, reporter)
        facts["seconds"] = round(time.monotonic() - started, 1)
        provenance = {"source": str(options.model), "scheme": options.scheme,
                      "method": options.method, "group_size": options.group_size,
                      "smoothing_strength": options.smoothing_strength, **facts}
        (partial / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
        reporter.stage("finish", 0.5, "renaming into place")
        if options.out.exists():
            raise BuildError(f"{options.out} appeared while building; not overwriting it")
        os.rename(partial, options.out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"path": str(options.out), **facts}


def _build_into(options: BuildOptions, partial: Path, reporter: Reporter) -> dict[str, Any]:
    reporter.stage("load", 0.0, "importing torch and llmcompressor")
    try:
        from llmcompressor import oneshot
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise BuildError(f"{exc.name or exc} is not installed for {sys.executable}: run the "
                         "builder with .venv-quant/bin/python (scripts/install-quant.sh makes it)") from exc
    reporter.stage("load", 0.3, f"reading {options.model}")
    model = AutoModelForCausalLM.from_pretrained(options.model, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    log.info("loaded %s (%s, %.1fM parameters)", type(model).__name__, model.dtype,
             sum(p.numel() for p in model.parameters()) / 1e6)
    recipe, calibrating = _recipe(options)
    dataset = _calibration_dataset(options, tokenizer) if options.needs_calibration else None
    reporter.stage("calibrate", 0.0, f"{options.label}: {len(recipe)} modifier(s)")
    with _layer_progress(model, reporter, calibrating, options.samples):
        oneshot(model=model, recipe=recipe, dataset=dataset,
                num_calibration_samples=options.samples, max_seq_length=options.max_seq_len,
                shuffle_calibration_samples=False)
    reporter.stage("save", 0.0, "writing the compressed-tensors checkpoint")
    model.save_pretrained(partial, save_compressed=True)
    reporter.stage("save", 0.8, "copying tokenizer, chat template and generation config")
    copied = copy_companions(options.model, partial)
    quantization = json.loads((partial / "config.json").read_text()).get("quantization_config")
    if not quantization:
        raise BuildError("llmcompressor wrote no quantization_config; the checkpoint would load "
                         "as an unquantized model")
    return {"label": options.label, "copied": copied,
            "calibration_sha256": _sha256(options.calibration) if dataset is not None else None,
            "versions": {name: _version(name) for name in
                         ("llmcompressor", "compressed-tensors", "transformers", "torch")}}


def _recipe(options: BuildOptions) -> tuple[list[Any], int]:
    """The modifiers, and how many of them run calibration passes over the layers."""
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier

    ignore = list(IGNORED_MODULES)
    kwargs: dict[str, Any]
    if options.scheme == "w8a8-int8":
        # int8 weights per output channel, int8 activations with a dynamic scale per token:
        # what vLLM's CPU int8 kernel (CPUInt8ScaledMM) runs.
        kwargs = {"targets": ["Linear"], "scheme": "W8A8", "ignore": ignore}
    elif options.scheme == "w4a16":
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

        weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                                   group_size=options.group_size)
        kwargs = {"config_groups": {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
                  "ignore": ignore}
    else:
        kwargs = {"targets": ["Linear"], "scheme": "FP8_DYNAMIC", "ignore": ignore}
    if options.method == "rtn":
        return [QuantizationModifier(**kwargs)], 0
    recipe: list[Any] = []
    if options.smoothing_strength:
        from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

        recipe.append(SmoothQuantModifier(smoothing_strength=options.smoothing_strength))
    recipe.append(GPTQModifier(**kwargs))
    return recipe, len(recipe)


def _calibration_dataset(options: BuildOptions, tokenizer: Any) -> Any:
    from datasets import Dataset

    samples = read_samples(options.calibration)
    if len(samples) < options.samples:
        raise BuildError(f"--samples {options.samples}: {options.calibration} holds only "
                         f"{len(samples)} samples")
    ids: list[list[int]] = []
    for sample in pick(samples, options.samples):
        if sample.kind == "chat" and tokenizer.chat_template:
            text = tokenizer.apply_chat_template(sample.messages(), tokenize=False)
        elif sample.kind == "chat":
            text = "\n".join(f"{m['role']}: {m['content']}" for m in sample.messages())
        else:
            text = sample.text
        ids.append(tokenizer(text, add_special_tokens=True, truncation=True,
                             max_length=options.max_seq_len)["input_ids"])
    log.info("calibration: %d samples, %d tokens (mean %.0f)", len(ids), sum(map(len, ids)),
             sum(map(len, ids)) / len(ids))
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(x) for x in ids]})


@contextmanager
def _layer_progress(model: Any, reporter: Reporter, passes: int, samples: int) -> Iterator[None]:
    """Calibration percent from forward calls of the decoder layers.

    llmcompressor runs each calibrating modifier layer by layer, every sample through a layer
    twice (to calibrate, then to propagate its quantized output), so the expected number of
    layer calls is layers x samples x 2 x passes.
    """
    layers = _decoder_layers(model)
    expected = len(layers) * samples * 2 * passes
    if not layers or not expected:
        yield
        return
    calls = 0

    # Runs once per layer per sample: keep it cheap.
    def hook(module: Any, args: Any, output: Any) -> None:
        nonlocal calls
        calls += 1
        reporter.stage("calibrate", calls / expected, f"layer {layers.index(module) + 1}/{len(layers)}",
                       force=False)

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _decoder_layers(model: Any) -> list[Any]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""
