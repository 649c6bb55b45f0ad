"""The output gate: does a candidate still say what the full-precision reference says?

Candidates are vLLM servers (a quantized variant, or each worker of a prefill/decode pair); the
reference is the base model in one vLLM server. Greedy answers of a small model are fragile (one
flipped token and the rest of the answer differs), so the gate compares teacher-forced:

1. the reference answers each prompt greedily (``max_tokens`` tokens), and scores its own answer;
2. each candidate scores the same prompt + answer token ids with ``prompt_logprobs``;
3. per answer position: does the candidate's top-1 token equal the reference's token, and how far
   apart are the two log-probabilities of that token (|Δ logprob|, nats).

A request with ``prompt_logprobs`` computes its whole prompt (vLLM skips prefix-cache and
KV-connector hits for it), so a prefill or decode worker is scored on its own weights.

    python -m inference.output_gate --reference http://127.0.0.1:8300 \\
        --candidate decode=http://127.0.0.1:8200 --candidate prefill=http://127.0.0.1:8100
    python -m inference.output_gate --reference-model data/models/smollm2-135m-instruct \\
        --dtype float32 --cores 1 --candidate http://127.0.0.1:8080 --json

Exit status: 0 the gate passed, 1 it failed its thresholds, 2 it could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from inference.child_env import child_environment
from inference.launch import LaunchError, WorkerSpec, build_command
from inference.process_groups import stop_group
from inference.worker_auth import WorkerKeys

PROMPTS_FILE = Path(__file__).with_name("gate_prompts.json")
DEFAULT_PROMPTS = 8
DEFAULT_MAX_TOKENS = 16
DEFAULT_MIN_AGREEMENT = 0.9
DEFAULT_MAX_MEAN_DELTA = 0.5
REQUEST_TIMEOUT_S = 300.0
SERVER_START_TIMEOUT_S = 420.0


class GateError(RuntimeError):
    """The gate could not run (a server unreachable, an answer without logprobs)."""


@dataclass(frozen=True)
class Thresholds:
    min_agreement: float = DEFAULT_MIN_AGREEMENT
    max_mean_delta: float = DEFAULT_MAX_MEAN_DELTA


@dataclass(frozen=True)
class ReferenceAnswer:
    prompt_ids: list[int]
    answer_ids: list[int]
    # The reference's own teacher-forced log-probability of each answer token.
    logprobs: list[float]


@dataclass(frozen=True)
class PromptScore:
    prompt: int  # index into the prompt list
    positions: int
    agreed: int
    mean_abs_delta: float
    max_abs_delta: float

    @property
    def agreement(self) -> float:
        return self.agreed / self.positions if self.positions else 1.0


@dataclass(frozen=True)
class CandidateScore:
    label: str
    url: str
    prompts: list[PromptScore]

    @property
    def positions(self) -> int:
        return sum(p.positions for p in self.prompts)

    @property
    def agreement(self) -> float:
        return sum(p.agreed for p in self.prompts) / self.positions if self.positions else 1.0

    @property
    def mean_abs_delta(self) -> float:
        if not self.positions:
            return 0.0
        return sum(p.mean_abs_delta * p.positions for p in self.prompts) / self.positions

    @property
    def max_abs_delta(self) -> float:
        return max((p.max_abs_delta for p in self.prompts), default=0.0)

    def failures(self, thresholds: Thresholds) -> list[str]:
        reasons = []
        if self.agreement < thresholds.min_agreement:
            reasons.append(f"{self.label}: top-1 agreement {self.agreement:.1%} is below "
                           f"{thresholds.min_agreement:.1%}")
        if self.mean_abs_delta > thresholds.max_mean_delta:
            reasons.append(f"{self.label}: mean |Δ logprob| {self.mean_abs_delta:.3f} is above "
                           f"{thresholds.max_mean_delta:.3f}")
        return reasons

    def totals(self) -> dict[str, float | int]:
        return {"positions": self.positions, "agreement": round(self.agreement, 4),
                "mean_abs_logprob_delta": round(self.mean_abs_delta, 4),
                "max_abs_logprob_delta": round(self.max_abs_delta, 4)}


@dataclass(frozen=True)
class GateReport:
    candidates: list[CandidateScore]
    thresholds: Thresholds
    prompt_count: int
    max_tokens: int
    elapsed_s: float
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons

    def totals(self) -> dict[str, float | int]:
        """The worst candidate's figures: the gate is as good as its weakest worker."""
        if not self.candidates:
            return {"positions": 0, "agreement": 1.0, "mean_abs_logprob_delta": 0.0,
                    "max_abs_logprob_delta": 0.0}
        return {
            "positions": sum(c.positions for c in self.candidates),
            "agreement": round(min(c.agreement for c in self.candidates), 4),
            "mean_abs_logprob_delta": round(max(c.mean_abs_delta for c in self.candidates), 4),
            "max_abs_logprob_delta": round(max(c.max_abs_delta for c in self.candidates), 4),
        }

    def as_dict(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "reasons": self.reasons,
            "thresholds": asdict(self.thresholds),
            "prompts": self.prompt_count,
            "max_tokens": self.max_tokens,
            "elapsed_s": round(self.elapsed_s, 2),
            "totals": self.totals(),
            "candidates": [
                {"label": c.label, "url": c.url, "totals": c.totals(),
                 "prompts": [{**asdict(p), "agreement": round(p.agreement, 4),
                              "mean_abs_delta": round(p.mean_abs_delta, 4),
                              "max_abs_delta": round(p.max_abs_delta, 4)} for p in c.prompts]}
                for c in self.candidates
            ],
        }


def load_prompts(count: int, path: Path = PROMPTS_FILE) -> list[str]:
    prompts = json.loads(path.read_text())
    if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
        raise GateError(f"{path}: expected a JSON list of non-empty strings")
    if not 1 <= count <= len(prompts):
        raise GateError(f"prompts: {count} asked, {path} holds 1-{len(prompts)}")
    return prompts[:count]


def served_model(client: httpx.Client, url: str) -> str:
    try:
        response = client.get(f"{url}/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise GateError(f"{url}: cannot list its model ({exc})") from exc


def _completion(client: httpx.Client, url: str, body: dict[str, object]) -> dict[str, object]:
    try:
        response = client.post(f"{url}/v1/completions", json=body)
    except httpx.HTTPError as exc:
        raise GateError(f"{url}: {exc.__class__.__name__} {exc}") from exc
    if response.status_code != 200:
        raise GateError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
    choices = response.json().get("choices") or [{}]
    return dict(choices[0])


def token_logprobs(client: httpx.Client, url: str, model: str, ids: list[int],
                   start: int) -> list[tuple[float, bool]]:
    """For each token of ``ids`` from ``start`` on: (its log-probability, whether it is the top-1)."""
    choice = _completion(client, url, {
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1,
    })
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise GateError(f"{url}: no prompt_logprobs for {len(ids)} tokens in the answer")
    scored = []
    for position in range(start, len(ids)):
        entry = entries[position] or {}
        token = entry.get(str(ids[position]))
        if token is None:
            raise GateError(f"{url}: prompt_logprobs lack token {ids[position]} at {position}")
        logprob = float(token["logprob"])
        # -inf (a token the model cannot produce) would poison the means; clamp it.
        scored.append((max(logprob, -100.0), int(token.get("rank", 0)) == 1))
    return scored


def reference_answers(client: httpx.Client, url: str, prompts: list[str],
                      max_tokens: int) -> list[ReferenceAnswer]:
    model = served_model(client, url)
    answers = []
    for prompt in prompts:
        choice = _completion(client, url, {
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True,
        })
        prompt_ids = list(choice.get("prompt_token_ids") or [])
        answer_ids = list(choice.get("token_ids") or [])
        if not prompt_ids or not answer_ids:
            raise GateError(f"{url}: the answer carries no token ids (return_token_ids)")
        scored = token_logprobs(client, url, model, prompt_ids + answer_ids, len(prompt_ids))
        answers.append(ReferenceAnswer(prompt_ids, answer_ids, [lp for lp, _ in scored]))
    return answers


def score_candidate(client: httpx.Client, label: str, url: str,
                    answers: list[ReferenceAnswer]) -> CandidateScore:
    model = served_model(client, url)
    scores = []
    for index, answer in enumerate(answers):
        scored = token_logprobs(client, url, model, answer.prompt_ids + answer.answer_ids,
                                len(answer.prompt_ids))
        deltas = [abs(lp - ref) for (lp, _), ref in zip(scored, answer.logprobs, strict=True)]
        scores.append(PromptScore(
            prompt=index, positions=len(deltas), agreed=sum(top for _, top in scored),
            mean_abs_delta=sum(deltas) / len(deltas), max_abs_delta=max(deltas)))
    return CandidateScore(label, url, scores)


def run_gate(reference_url: str, candidates: dict[str, str], prompts: list[str],
             max_tokens: int = DEFAULT_MAX_TOKENS, thresholds: Thresholds | None = None,
             answers: list[ReferenceAnswer] | None = None,
             keys: Mapping[str, str | None] | None = None) -> GateReport:
    """Score every candidate against the reference; ``answers`` skips asking the reference.
    ``keys``: each server's key by its URL (inference/worker_auth.py)."""
    thresholds = thresholds or Thresholds()
    started = time.monotonic()
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, auth=WorkerKeys(keys or {})) as client:
        if answers is None:
            answers = reference_answers(client, reference_url, prompts, max_tokens)
        scores = [score_candidate(client, label, url, answers) for label, url in candidates.items()]
    reasons = [reason for score in scores for reason in score.failures(thresholds)]
    return GateReport(scores, thresholds, len(prompts), max_tokens, time.monotonic() - started,
                      reasons)


@dataclass(frozen=True)
class ReferenceServer:
    """How to start the reference: the base model in one plain vLLM server."""

    model_path: str
    port: int
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    cores: tuple[int, ...] = ()
    kv_cache_gib: int = 1
    cache_dir: str | None = None
    served_model_name: str = "reference"
    enforce_eager: bool = False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_command(server: ReferenceServer, port: int) -> tuple[list[str], dict[str, str]]:
    """The reference server's argv and environment, for whoever starts it."""
    return build_command(WorkerSpec(
        role="colocated", model_path=server.model_path, served_model_name=server.served_model_name,
        port=port, max_model_len=server.max_model_len, dtype=server.dtype,
        cpu_cores=server.cores, kv_cache_gib=server.kv_cache_gib, cache_dir=server.cache_dir,
        enforce_eager=server.enforce_eager,
    ))


@contextmanager
def running_server(server: ReferenceServer, log_path: Path | None = None,
                   timeout_s: float = SERVER_START_TIMEOUT_S,
                   started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> Iterator[str]:
    """Start the reference server (port 0: a free one), yield its URL once healthy, and stop it
    (its whole process group). ``started`` receives the process, for whoever must be able to
    stop it from elsewhere."""
    port = server.port or free_port()
    argv, env = server_command(server, port)
    log = open(log_path, "ab") if log_path else tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(argv, env=child_environment(env), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    if started is not None:
        started(process)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, timeout_s)
        yield url
    finally:
        stop_group(process)
        log.close()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise GateError(f"the reference server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise GateError(f"the reference server at {url} was not healthy within {timeout_s:.0f} s")


def format_table(report: GateReport) -> str:
    lines = [f"{'candidate':<28} {'prompt':>6} {'tokens':>6} {'top-1 agree':>11} "
             f"{'mean |Δlp|':>10} {'max |Δlp|':>9}"]
    for candidate in report.candidates:
        for p in candidate.prompts:
            lines.append(f"{candidate.label:<28} {p.prompt:>6} {p.positions:>6} {p.agreement:>11.1%} "
                         f"{p.mean_abs_delta:>10.4f} {p.max_abs_delta:>9.4f}")
        lines.append(f"{candidate.label:<28} {'all':>6} {candidate.positions:>6} "
                     f"{candidate.agreement:>11.1%} {candidate.mean_abs_delta:>10.4f} "
                     f"{candidate.max_abs_delta:>9.4f}")
    verdict = "PASSED" if report.passed else "FAILED: " + "; ".join(report.reasons)
    lines.append(f"gate {verdict} (min agreement {report.thresholds.min_agreement:.1%}, "
                 f"max mean |Δ logprob| {report.thresholds.max_mean_delta:.3f}; "
                 f"{report.prompt_count} prompts x {report.max_tokens} tokens, "
                 f"{report.elapsed_s:.1f} s)")
    return "\n".join(lines)


def _candidate(value: str) -> tuple[str, str]:
    label, _, url = value.rpartition("=")
    if not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected [label=]http://host:port, got {value!r}")
    return label or url, url.rstrip("/")


def _cores(value: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in value.split(",") if part)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from exc


def _fraction(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"expected 0..1, got {value}")
    return number


def _positive(value: str) -> float:
    number = float(value)
    if number < 0 or not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {value}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.output_gate",
        description="Compare candidate vLLM servers with a full-precision reference, teacher-forced: "
                    "top-1 agreement and |Δ logprob| on the reference's greedy answers.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--reference", type=lambda v: _candidate(v)[1],
                        help="URL of a running reference server")
    source.add_argument("--reference-model", help="start a reference server with this model directory")
    parser.add_argument("--candidate", type=_candidate, action="append", required=True,
                        help="[label=]URL of a server to score; repeat for several")
    parser.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS,
                        help=f"how many of the shipped prompts (default {DEFAULT_PROMPTS})")
    parser.add_argument("--prompts-file", type=Path, default=PROMPTS_FILE)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                        help=f"answer tokens per prompt (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--min-agreement", type=_fraction, default=DEFAULT_MIN_AGREEMENT)
    parser.add_argument("--max-mean-delta", type=_positive, default=DEFAULT_MAX_MEAN_DELTA,
                        help="largest mean |Δ logprob| in nats that passes")
    parser.add_argument("--dtype", default="bfloat16", help="the started reference's dtype")
    parser.add_argument("--cores", type=_cores, default=(), help="the started reference's CPU cores")
    parser.add_argument("--port", type=int, default=0,
                        help="the started reference's port (default: a free one)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--log", type=Path, help="the started reference's log file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_tokens < 1:
        parser.error(f"--max-tokens: expected at least 1, got {args.max_tokens}")
    if args.reference_model and not Path(args.reference_model, "config.json").is_file():
        parser.error(f"--reference-model: no config.json in {args.reference_model}")
    try:
        prompts = load_prompts(args.prompts, args.prompts_file)
    except (GateError, OSError, ValueError) as exc:
        parser.error(f"--prompts: {exc}")
    thresholds = Thresholds(args.min_agreement, args.max_mean_delta)
    candidates = dict(args.candidate)
    # SIGTERM must run the finally blocks that stop a started reference server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    try:
        if args.reference_model:
            server = ReferenceServer(os.path.abspath(args.reference_model), args.port, args.dtype,
                                     args.max_model_len, args.cores)
            with running_server(server, args.log) as url:
                report = run_gate(url, candidates, prompts, args.max_tokens, thresholds)
        else:
            report = run_gate(args.reference, candidates, prompts, args.max_tokens, thresholds)
    except LaunchError as exc:
        parser.error(str(exc))
    except GateError as exc:
        print(f"output gate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_table(report))
    return 0 if report.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
