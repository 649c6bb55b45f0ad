"""The builder CLI on a tiny random-weight Llama: W8A8 and W4A16 (round to nearest, seconds),
what it writes and a SIGTERM midway. vLLM serving both with its CPU int8 and W4A16 kernels is
checked where they serve PD behind the output gate (tests/quality/test_gate_e2e.py), not on two
servers of their own."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from console.catalog.inspection import inspect_model_dir
from inference.quantization.output import PROVENANCE_FILE, partial_dir
from tests.quant.conftest import QUANT_PYTHON, REPO, quantize

VARIANTS = {"w8a8": ("w8a8-int8", "compressed-tensors w8a8"),
            "w4a16": ("w4a16", "compressed-tensors w4a16")}


@pytest.fixture(scope="session")
def built(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list]]:
    root = tmp_path_factory.mktemp("built")
    found = {}
    for key, (scheme, _) in VARIANTS.items():
        result, events = quantize(tiny_llama, root / key, "--scheme", scheme, "--method", "rtn")
        assert result.returncode == 0, result.stderr[-3000:]
        found[key] = (root / key, events)
    return found


@pytest.mark.parametrize("key", list(VARIANTS))
def test_rtn_writes_a_complete_servable_variant(built: dict[str, tuple[Path, list]], tiny_llama: Path,
                                               key: str) -> None:
    out, events = built[key]
    assert events[-1]["event"] == "done" and events[-1]["path"] == str(out)
    percents = [e["percent"] for e in events]
    assert percents == sorted(percents) and percents[-1] == 100
    assert [e["stage"] for e in events if e["event"] == "progress"][0] == "prepare"
    assert not partial_dir(out).exists()

    variant, source = inspect_model_dir(str(out)), inspect_model_dir(str(tiny_llama))
    assert variant.quantization == VARIANTS[key][1]
    # Same KV geometry and the same tokenizer and chat template, byte for byte: what the
    # pre-flight checks compare between a plan's prefill and decode variants.
    assert (variant.num_layers, variant.num_kv_heads, variant.head_dim, variant.kv_dtype) == (
        source.num_layers, source.num_kv_heads, source.head_dim, source.kv_dtype)
    assert variant.tokenizer_sha256 == source.tokenizer_sha256
    assert variant.chat_template_sha256 == source.chat_template_sha256 != ""
    assert variant.generation_config == source.generation_config
    assert variant.size_bytes < source.size_bytes
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["ignore"] == ["lm_head"]
    provenance = json.loads((out / PROVENANCE_FILE).read_text())
    assert provenance["method"] == "rtn" and provenance["versions"]["llmcompressor"] == "0.14.0.1"


def test_w4a16_records_its_group_size(built: dict[str, tuple[Path, list]]) -> None:
    quant = json.loads((built["w4a16"][0] / "config.json").read_text())["quantization_config"]
    weights = quant["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["strategy"], weights["group_size"]) == (4, "group", 64)


def test_a_build_terminated_midway_leaves_nothing(tiny_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "w8"
    builder = subprocess.Popen(
        [str(QUANT_PYTHON), "-m", "inference.quantize", "--model", str(tiny_llama), "--out", str(out),
         "--scheme", "w8a8-int8"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert builder.stdout is not None
    for line in builder.stdout:
        if json.loads(line)["stage"] == "load":
            break
    assert partial_dir(out).is_dir()  # it had started writing
    builder.send_signal(signal.SIGTERM)
    rest = builder.stdout.read()
    assert builder.wait(timeout=60) == 143
    assert json.loads(rest.splitlines()[-1]) == {"event": "error", "flag": None,
                                                "error": "terminated; nothing was left behind"}
    assert list(tmp_path.iterdir()) == []
