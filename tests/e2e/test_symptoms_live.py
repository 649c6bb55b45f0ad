"""The troubleshooting view against real faults: each symptom injected into the session's
borrowed tiny-model deployment (tests/borrowed.py), and the doctor
(``GET /api/v1/deployments/<id>/doctor``) asked until it names that symptom and its cause.

One test walks through injections that need no restart:
1. a prefill engine frozen while prompts arrive (SIGSTOP of its engine processes): the first
   token comes late (6), the cause on prefill's side;
2. a flood far past the plan's concurrency: heavy queueing (5), the cause capacity.
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

from inference.router.asked_placement import PLACEMENT_HEADER
from tests.borrowed import Handle
from tests.e2e.doctor import wait_for_symptom

pytestmark = pytest.mark.vllm

# Three times the plan's default TTFT SLO (2 s), which the borrowed plan keeps.
FROZEN_PREFILL_S = 6


def engine_processes(pid: int) -> list[psutil.Process]:
    """A vLLM server's engine core and model worker (renamed VLLM::...), not its API server:
    frozen, they stop generating while /health still answers, as a hung engine does."""
    return [child for child in psutil.Process(pid).children(recursive=True)
            if " ".join(child.cmdline()).startswith("VLLM::")]


@contextmanager
def frozen(pid: int) -> Iterator[None]:
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
