"""``python -m inference.advisor``: the ranked table, and errors that name the flag or field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.advisor.cli import main

ROOT = Path(__file__).resolve().parents[2]
SPEEDS = {"prefill_ms": {"tokens": [0, 1000], "ms": [0, 1000]},
          "decode_step_ms": {"batch": [1, 16], "ms": [20, 50]},
          "handoff_ms": {"tokens": [0, 1000], "ms": [5, 10]}}
LOAD = {"streams": [{"rate_per_s": 2, "requests": 20, "prompt_tokens": [50, 400], "output_tokens": 20}]}


def write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def run(tmp_path: Path, *extra: str, speeds: Any = SPEEDS, load: Any = LOAD) -> list[str]:
    return ["--speeds", str(write(tmp_path, "speeds.json", speeds)),
            "--load", str(write(tmp_path, "load.json", load)),
            "--ttft-slo-ms", "500", "--tpot-slo-ms", "100", "--devices", "2", *extra]


def test_help_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "inference.advisor", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--ttft-slo-ms" in result.stdout


def test_it_prints_the_candidates_ranked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(run(tmp_path, "--seeds", "2")) == 0
    out = capsys.readouterr().out
    assert "2 seeds, 20 requests each" in out
    assert "TTFT <= 500 ms and TPOT <= 100 ms" in out
    rows = [line.split()[1:3] for line in out.splitlines() if line[:1].isdigit()]
    assert sorted(" ".join(r) for r in rows) == ["PD 1P:1D", "colocated x1", "colocated x2"]
    assert out.splitlines()[-1].startswith("recommended: ")  # no overload note after it


def test_it_reads_the_load_from_router_timelines(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    records = [{"start": 100.0 + i, "prompt_tokens": 40 + i, "completion_tokens": 8, "status": 200}
               for i in range(6)]
    lines = [f"timeline {json.dumps(record)}" for record in records]
    args = run(tmp_path)
    at = args.index("--load")
    args[at:at + 2] = ["--timelines", str(write(tmp_path, "router.log", "\n".join(lines)))]
    assert main(args) == 0
    assert "load: 6 recorded requests (0 skipped" in capsys.readouterr().out


@pytest.mark.parametrize(("change", "message"), [
    ({"speeds": "{not json"}, "advisor: --speeds: {dir}/speeds.json is not JSON"),
    ({"speeds": {**SPEEDS, "prefill_ms": {"tokens": [10], "ms": [5]}}},
     "advisor: --speeds: {dir}/speeds.json: prefill_ms.tokens: needs at least two prompt lengths"),
    ({"load": {"streams": [{"rate_per_s": 2, "requests": 5, "prompt_tokens": 0, "output_tokens": 3}]}},
     "advisor: --load: {dir}/load.json: streams[0].prompt_tokens: must be at least 1"),
    ({"speeds": {**SPEEDS, "devices_per_server": 4}},
     "advisor: --devices: 2 devices cannot hold one server of 4"),
])
def test_bad_input_names_the_flag_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            change: dict[str, Any], message: str) -> None:
    assert main(run(tmp_path, **change)) == 2
    assert capsys.readouterr().err.strip().startswith(message.format(dir=tmp_path))


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = run(tmp_path)
    args[args.index("--load") + 1] = str(tmp_path / "nowhere.json")
    assert main(args) == 2
    assert f"advisor: --load: cannot read {tmp_path}/nowhere.json" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--devices", "0", "argument --devices: must be above 0"),
    ("--tpot-slo-ms", "fast", "argument --tpot-slo-ms: expected a number, got 'fast'"),
    ("--seeds", "1.5", "argument --seeds: expected a whole number, got '1.5'"),
])
def test_bad_flags_are_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       flag: str, value: str, message: str) -> None:
    args = run(tmp_path)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_load_source_is_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = run(tmp_path)
    del args[args.index("--load"):args.index("--load") + 2]
    with pytest.raises(SystemExit):
        main(args)
    assert "one of the arguments --load --timelines is required" in capsys.readouterr().err


def test_an_overload_is_said_to_be_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flood = {"streams": [{"rate_per_s": 50, "requests": 100, "prompt_tokens": 900, "output_tokens": 20}]}
    assert main(run(tmp_path, "--seeds", "1", load=flood)) == 0
    assert "note: no candidate meets both SLOs for 90% of requests" in capsys.readouterr().out
