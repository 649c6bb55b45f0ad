"""Schemathesis over the committed schema (docs/openapi.yaml) against a live console: every
operation, the stateful phase included, and no answer may be a server error.

Here rather than in tests/console: that suite runs twice in `make test` (SQLite, then
PostgreSQL) and in-process; this one starts a real server process with its own SQLite database,
takes two to four minutes on a busy 2-core machine, and needs to run once.

Nothing is left out, not even the operations that would start vLLM (start, gate runs,
measurements, quantization jobs): the console only records those requests, and neither the
supervise daemon nor a Celery worker runs beside it to act on them (tests/fuzz/live_console.py).
The test prints what they recorded.

PDSERVE_FUZZ_SEED, PDSERVE_FUZZ_MAX_EXAMPLES and PDSERVE_FUZZ_PHASES change the run (the printed
command repeats it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.console.tiny_models import write_model
from tests.fuzz.live_console import PASSWORD, REPO, USERNAME, LiveConsole, live_console
from tests.fuzz.run_report import read_report

SCHEMA = REPO / "docs" / "openapi.yaml"
SEED = int(os.environ.get("PDSERVE_FUZZ_SEED", "20261201"))
MAX_EXAMPLES = int(os.environ.get("PDSERVE_FUZZ_MAX_EXAMPLES", "10"))
# Every check but three that judge the schema's completeness, not the API: it does not list each
# 4xx an operation answers (status_code_conformance), and whether valid data is accepted
# depends on rows that exist (a key names deployments: positive_data_acceptance); the
# negative_data_rejection failures are bodies an action without one ignores (nodes/discover).
CHECKS = "all"
EXCLUDED_CHECKS = "status_code_conformance,positive_data_acceptance,negative_data_rejection"
# The coverage phase is left out: over this schema's 70-odd operations it sends some 7,000
# requests (every boundary of every body field, each method a path lacks) and takes over ten
# minutes on a 2-core machine; run it by hand with PDSERVE_FUZZ_PHASES.
PHASES = os.environ.get("PDSERVE_FUZZ_PHASES", "examples,fuzzing,stateful")
TIMEOUT_S = 600
# What a supervisor or a Celery worker would act on by starting vLLM.
VLLM_OPERATIONS = ("POST /api/v1/deployments/{id}/start/", "POST /api/v1/deployments/{id}/gate/",
                   "POST /api/v1/measurements/", "POST /api/v1/quantization-jobs/")


@pytest.fixture
def console(tmp_path: Path) -> Iterator[LiveConsole]:
    with live_console(tmp_path) as live:
        seed_catalog(live, tmp_path / "models")
        yield live


def seed_catalog(live: LiveConsole, models: Path) -> None:
    """A base model, a variant and a plan, so that operations on them find something to act on
    (the fuzzer's own creates mostly fail: a variant needs a model directory on disk)."""
    write_model(models / "bf16")
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Token {live.token}"},
                      timeout=60) as api:
        for path, body in [
            ("/api/v1/models/", {"name": "tiny"}),
            ("/api/v1/variants/", {"base_model": "tiny", "name": "bf16", "path": str(models / "bf16")}),
            ("/api/v1/deployments/", {"name": "tiny-1p1d", "base_model": "tiny",
                                      "served_model_name": "tiny",
                                      "prefill": {"variant": "tiny/bf16", "instances": [{}]},
                                      "decode": {"variant": "tiny/bf16", "instances": [{}]}}),
        ]:
            response = api.post(path, json=body)
            assert response.status_code == 201, (path, response.text)


def failures(output: str) -> str:
    """Schemathesis's failures section, each with its curl line (not the warnings after it)."""
    start = output.find(" FAILURES ")
    end = output.find(" WARNINGS ", start)
    return output[start:end] if start >= 0 else output[-6000:]


def operations_in(schema: Path) -> set[str]:
    paths = yaml.safe_load(schema.read_text())["paths"]
    return {f"{method.upper()} {path}" for path, item in paths.items() for method in item}


def test_the_api_answers_no_server_error(console: LiveConsole, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    ndjson = tmp_path / "run.ndjson"
    command = [
        str(Path(sys.executable).with_name("st")), "run", str(SCHEMA), "--url", console.url,
        "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES), "--workers", "1",
        "--phases", PHASES, "--checks", CHECKS, "--exclude-checks", EXCLUDED_CHECKS,
        "--report", "ndjson", "--report-ndjson-path", str(ndjson), "--no-color",
    ]
    # Its cache directory goes to the test's folder, not the repository.
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks", "PYTHONPATH": str(REPO),
           "PDSERVE_FUZZ_URL": console.url, "PDSERVE_FUZZ_USERNAME": USERNAME,
           "PDSERVE_FUZZ_PASSWORD": PASSWORD}
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    report = read_report(ndjson)
    recorded = {path: console.get(path).json()["count"] for path in (
        "/api/v1/gate-results/", "/api/v1/measurements/", "/api/v1/quantization-jobs/")}
    started = [d["name"] for d in console.get("/api/v1/deployments/?limit=1000").json()["results"]
               if d["desired_state"] == "running"]
    processes = console.get("/api/v1/processes/").json()["count"]

    asked = {label: report.operations[label].accepted for label in VLLM_OPERATIONS
             if label in report.operations}
    summary = "\n".join([
        "", f"SCHEMATHESIS_HOOKS=tests.fuzz.hooks st {' '.join(command[2:])}",
        f"seed {SEED}, at most {MAX_EXAMPLES} examples per operation, phases {PHASES}, "
        f"checks: {CHECKS} but {EXCLUDED_CHECKS}",
        report.table(operations_in(SCHEMA)),
        f"cases: {report.cases} ({dict(report.phases)}), rejected (4xx): {report.rejected} "
        f"({report.rejected / report.cases:.0%}), server errors: {len(report.server_errors)}",
        f"accepted calls that would start vLLM: {asked}",
        f"left at the end (no supervisor, no Celery worker ran them): {recorded}, "
        f"deployments wanted running: {started}, Celery messages: {dict(console.queued_tasks())}, "
        f"processes in the table: {processes}",
    ])
    with capsys.disabled():
        print(summary)
    assert not report.server_errors, "\n".join(report.server_errors) + summary
    assert run.returncode == 0, failures(run.stdout) + run.stderr[-2000:]
    assert report.cases > 0 and processes == 0
