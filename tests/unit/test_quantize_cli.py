"""The builder CLI's input checks and the shipped calibration text; no torch is imported here:
every refusal comes before the build starts (building is tested in tests/quant)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from inference.quantization.calibration import DEFAULT_FILE, pick, read_samples
from inference.quantization.progress import Reporter, parse

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / "data" / "models" / "smollm2-135m-instruct"
SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                  "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                  "head_dim": 64, "num_hidden_layers": 30}


def model(tmp_path: Path, **config: object) -> Path:
    directory = tmp_path / "model"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**SMOLLM2_CONFIG, **config}))
    return directory


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # The main environment has no llmcompressor: these must all stop before it is needed.
    return subprocess.run([sys.executable, "-m", "inference.quantize", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_help_works_without_llmcompressor() -> None:
    result = cli("--help")
    assert result.returncode == 0
    assert "--group-size" in result.stdout and "w8a8-int8" in result.stdout


@pytest.mark.parametrize(("args", "config", "flag", "words"), [
    (["--scheme", "w4a16", "--group-size", "128"], {}, "--group-size",
     "128 does not divide hidden_size 576, num_attention_heads x head_dim 576; this model takes"),
    (["--scheme", "w4a16", "--group-size", "0"], {}, "--group-size", "positive even"),
    (["--scheme", "w8a8-int8", "--group-size", "64"], {}, "--group-size", "only applies to"),
    (["--scheme", "fp8"], {}, "--scheme", "fp8 is not served on this device (CPU"),
    (["--scheme", "w8a8-int8", "--method", "rtn", "--smoothing-strength", "0.5"], {},
     "--smoothing-strength", "SmoothQuant needs calibration"),
    (["--scheme", "w8a8-int8", "--samples", "5000"], {}, "--samples", "between 1 and 1024"),
    (["--scheme", "w8a8-int8"], {"architectures": ["BertForMaskedLM"]}, "--model",
     "architecture BertForMaskedLM is not supported for quantization"),
    (["--scheme", "w8a8-int8"], {"quantization_config": {"quant_method": "gptq"}}, "--model",
     "already quantized (gptq)"),
])
def test_bad_input_exits_2_naming_the_flag_and_writes_nothing(
        tmp_path: Path, args: list[str], config: dict[str, object], flag: str, words: str) -> None:
    out = tmp_path / "out"
    result = cli("--model", str(model(tmp_path, **config)), "--out", str(out), *args)
    assert result.returncode == 2, result.stderr
    event = json.loads(result.stdout.splitlines()[-1])
    assert event["event"] == "error" and event["flag"] == flag
    assert words in event["error"]
    assert f"error: {flag}: " in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_an_existing_out_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    result = cli("--model", str(model(tmp_path)), "--out", str(tmp_path / "out"), "--scheme", "w4a16")
    assert result.returncode == 2
    assert "--out: " in result.stderr and "already exists" in result.stderr


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    result = cli("--model", str(tmp_path), "--out", str(tmp_path / "out"), "--scheme", "w4a16")
    assert result.returncode == 2
    assert "--model: no config.json" in result.stderr


def test_the_builder_without_llmcompressor_says_which_environment_to_use(tmp_path: Path) -> None:
    result = cli("--model", str(model(tmp_path)), "--out", str(tmp_path / "out"), "--scheme", "w4a16",
                 "--method", "rtn")
    assert result.returncode == 1
    assert "run the builder with .venv-quant/bin/python" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the partial dir is gone too


def test_the_calibration_text_has_forty_varied_samples_of_about_120_tokens() -> None:
    samples = read_samples(DEFAULT_FILE)
    assert len(samples) == 40
    assert {s.kind for s in samples} == {"prose", "dialogue", "code", "chat"}
    # Counted with SmolLM2's tokenizer (`make test` prepares the default model first); the
    # builder truncates at --max-seq-len 128.
    tokenizer = Tokenizer.from_file(str(SMOLLM2 / "tokenizer.json"))
    tokens = [len(tokenizer.encode(s.text).ids) for s in samples]
    assert min(tokens) >= 80 and 110 <= sum(tokens) / len(tokens) <= 160
    for sample in samples:
        if sample.kind == "chat":
            roles = [m["role"] for m in sample.messages()]
            assert roles[-1] == "assistant" and "user" in roles


def test_a_few_samples_still_mix_the_kinds() -> None:
    assert [s.kind for s in pick(read_samples(DEFAULT_FILE), 4)] == ["prose", "dialogue", "code", "chat"]


def test_progress_lines_round_trip_and_stay_monotonic(tmp_path: Path) -> None:
    out = tmp_path / "progress"
    with out.open("w") as stream:
        reporter = Reporter(stream, min_interval_s=0)
        reporter.stage("calibrate", 0.5, force=False)
        reporter.stage("calibrate", 0.4, force=False)  # never backwards
        reporter.stage("save", 0.0)
        reporter.done(path="/x")
    events = [parse(line) for line in out.read_text().splitlines()]
    assert [e["percent"] for e in events] == [50.0, 90.0, 100.0]
    assert parse("Loading weights: 100%") is None and parse('{"event": "other"}') is None
