"""The troubleshooting view against real faults: each symptom injected into the session's
borrowed tiny-model deployment (tests/borrowed.py), and the doctor
(``GET /api/v1/deployments/<id>/doctor``) asked until it names that symptom and its cause.

One test walks through injections that need no restart:
1. a prefill engine frozen while prompts arrive (SIGSTOP of its engine processes): the first
   token comes late (6), the cause on prefill's side;
2. a flood far past the plan's concurrency: heavy queueing (5), the cause capacity;
3. decode's engine slowed, then frozen mid-stream once its streams are generating (decode's
   own metrics say so): generation stalls (7), the cause a hung worker.
The shared-storage KV directory made full (2) is named in tests/e2e/test_fault_matrix.py,
which injects it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.router.asked_placement import PLACEMENT_HEADER
from tests.borrowed import Handle
from tests.e2e.doctor import wait_for_symptom
from tests.vllm_starts import engine_processes

pytestmark = pytest.mark.vllm

# Three times the plan's default TTFT SLO (2 s), which the borrowed plan keeps.
FROZEN_PREFILL_S = 6
# Twice the doctor's stall threshold (console/diagnosis/latency.py STALL_S, 5 s): the collector
# samples every second, and a sample missed under load must not shorten the run below it.
FROZEN_DECODE_S = 10


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The server's engine processes stopped: they stop generating while /health still
    answers, as a hung engine does."""
    engines = engine_processes(pid)
    assert engines, f"no engine processes under {pid}"
    for process in engines:
        process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for process in engines:
            process.send_signal(signal.SIGCONT)


def stream(borrowed: Handle, max_tokens: int, prompt: str = "Tell me a story",
           headers: dict[str, str] | None = None) -> int:
    """A streamed completion through the router; the number of chunks it brought."""
    chunks = 0
    with httpx.stream("POST", f"{borrowed.router}/v1/completions", timeout=120,
                      headers=headers, json={
            "model": borrowed.served_model_name, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            chunks += line.startswith("data: {")
    return chunks


def signal_all(processes: list[psutil.Process], sig: signal.Signals) -> None:
    for process in processes:
        process.send_signal(sig)


@contextmanager
def slowed(pid: int, run_s: float = 0.02, period_s: float = 0.5
           ) -> Iterator[Callable[[float], None]]:
    """A vLLM server's engine run in slices (SIGCONT for ``run_s`` of every ``period_s``,
    SIGSTOP the rest), and a ``freeze(seconds)`` that stops it whole. The tiny model generates
    a 1,500-token stream in a fraction of a second, long before its API server has sent the
    chunks (measured: 6,000 tokens of four streams in 0.34 s, their chunks sent over 7 s), so
    an engine frozen "mid-stream" had nothing left to generate; slowed, it still does."""
    engines = engine_processes(pid)
    assert engines, f"no engine processes under {pid}"
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            signal_all(engines, signal.SIGCONT)
            time.sleep(run_s)
            signal_all(engines, signal.SIGSTOP)
            done.wait(period_s - run_s)

    slicer = threading.Thread(target=cycle, daemon=True)
    slicer.start()

    def freeze(seconds: float) -> None:
        done.set()
        slicer.join()
        signal_all(engines, signal.SIGSTOP)
        time.sleep(seconds)

    try:
        yield freeze
    finally:
        done.set()
        slicer.join()
        signal_all(engines, signal.SIGCONT)


def decoding(url: str, headers: dict[str, str]) -> tuple[float, float]:
    """A vLLM worker's requests running and tokens generated so far, from its /metrics."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    totals = {"vllm:num_requests_running": 0.0, "vllm:generation_tokens_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["vllm:num_requests_running"], totals["vllm:generation_tokens_total"]


def wait_mid_stream(url: str, headers: dict[str, str], timeout_s: float = 60) -> None:
    """Until the worker runs requests and its generated-token count moves: frozen before
    that, it would stall nothing (the previous attempts froze it 1 run in 3 before or after
    its streams, and the doctor rightly saw no stall)."""
    deadline = time.monotonic() + timeout_s
    _, before = decoding(url, headers)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        running, generated = decoding(url, headers)
        if running > 0 and generated > before:
            return
        before = generated
    raise AssertionError(f"{url} generated nothing for its streams within {timeout_s} s")


def in_threads(count: int, work: Callable[[], Any]) -> list[threading.Thread]:
    threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_each_injected_fault_is_named_with_its_cause(borrowed: Handle) -> None:
    prefill = borrowed.processes()["prefill-0"]
    deployment = borrowed.deployment()

    # 6. The first token comes late: prefill's engine frozen while long prompts arrive, each
    # naming its placement (pd_adaptive would let the borrowed deployment's fast decode compute
    # prompts of thousands of tokens itself once it has measured it).
    long_prompt = " ".join(f"The lighthouse log, line {i}: the sky is blue." for i in range(36))
    remote = {PLACEMENT_HEADER: "remote"}
    waiting = in_threads(4, lambda: stream(borrowed, 4, long_prompt, remote))
    with frozen(prefill["pid"]):
        time.sleep(FROZEN_PREFILL_S)
    for thread in waiting:
        thread.join(120)
    ttft = wait_for_symptom(borrowed, "ttft-high", "slow-prefill", ("present", "suspected"))
    assert ttft["causes"][0]["id"] in ("slow-prefill", "prefill-capacity"), ttft["causes"]

    # 5. Heavy queueing: eight times the plan's concurrency, sent again and again until the
    # doctor names it (over its one-minute window). Not streamed: 64 threads parsing every
    # chunk of the tiny model's fast streams took the cores, and kept only ~14 requests in
    # flight (half of them whole on the idle prefill worker), under the plan's 8 per decode.
    stop = threading.Event()

    def keep_sending() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                response = client.post(f"{borrowed.router}/v1/completions", json={
                    "model": borrowed.served_model_name, "prompt": "Tell me a story",
                    "max_tokens": 64, "ignore_eos": True})
                assert response.status_code == 200, response.text

    flood = in_threads(deployment["concurrency"] * 8, keep_sending)
    try:
        queueing = wait_for_symptom(borrowed, "queueing", "capacity", ("present", "suspected"))
    finally:
        stop.set()
        for thread in flood:
            thread.join(120)
    assert queueing["causes"][0]["id"] == "capacity", queueing["causes"]

    # 7. Generation stalls: decode's engine slowed, then frozen mid-stream (its API server
    # still answers /health and /metrics, as a hung engine's does). The streams are placed on
    # decode whole, and the freeze starts only once decode's metrics show them generating.
    decode = borrowed.processes()["decode-0"]
    [planned] = [w for w in deployment["workers"] if w["slot"] == "decode-0"]
    decode_url = f"http://127.0.0.1:{planned['port']}"
    local = {PLACEMENT_HEADER: "local"}
    chunks: list[int] = []
    with slowed(decode["pid"]) as freeze:
        streams = in_threads(4, lambda: chunks.append(stream(borrowed, 1500, "Tell me a story",
                                                             local)))
        wait_mid_stream(decode_url, borrowed.worker_headers())
        freeze(FROZEN_DECODE_S)
    for thread in streams:
        thread.join(120)
    assert len(chunks) == 4, "a stream did not finish after decode was thawed"
    stall = wait_for_symptom(borrowed, "stalls", "hung-worker")
    assert stall["causes"][0]["id"] == "hung-worker", stall["causes"]
