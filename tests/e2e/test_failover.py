"""Failover against real vLLM workers that are killed, frozen or abandoned under load.

A tiny random-weight Llama keeps the three workers (two prefill, one decode, shared-storage
KV: tests/e2e/tiny_pd.py, shared with the tool-call tests, which run first) cheap; the text is
noise, and these tests are about processes, not text. Two routers in front of the same workers:
one with a generous timeout, one with a 4 s timeout. Tests run in file order and the last ones
kill workers for good.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.launch import WorkerSpec, build_command
from tests.console.sockets import free_port
from tests.e2e.conftest import START_TIMEOUT_S, _wait_http
from tests.e2e.stale_prefill import StaleHandoffPrefill
from tests.e2e.tiny_pd import TinyPD
from tests.tiny_llama import TEST_CACHE_DIR, shared_tiny_llama

pytestmark = pytest.mark.vllm

SHORT_TIMEOUT_S = 4.0
PROMPT = "The ledger of the river towns lists " + " ".join(
    f"town {i} with {i * 37 % 900} barrels;" for i in range(60))


@dataclass
class Failover:
    router: str
    short_router: str
    workers: TinyPD

    @property
    def logs(self) -> Path:
        return self.workers.logs

    def url(self, name: str) -> str:
        return self.workers.url(name)

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.workers.signal(name, sig)


@pytest.fixture(scope="module")
def failover(tiny_pd: TinyPD) -> Failover:
    """Two routers in front of the session's tiny workers; they go with the workers."""
    router_port, short_router_port = free_port(), free_port()
    stack = Failover(router=f"http://127.0.0.1:{router_port}",
                     short_router=f"http://127.0.0.1:{short_router_port}", workers=tiny_pd)
    routers = {}
    for port, timeout in ((router_port, 60.0), (short_router_port, SHORT_TIMEOUT_S)):
        routers[f"http://127.0.0.1:{port}"] = tiny_pd.spawn(f"router-{port}", [
            sys.executable, "-m", "inference.router", "--served-model-name", "tiny",
            "--tokenizer", str(tiny_pd.model), "--max-model-len", "2048", "--port", str(port),
            "--prefill", stack.url("prefill-a"), "--prefill", stack.url("prefill-b"),
            "--decode", stack.url("decode"), "--request-timeout", str(timeout),
            # Every prompt through prefill, so that prefill failures are exercised.
            "--pd-policy", "remote", "--local-prefill-max-tokens", "0",
        ], {})
    for router, process in routers.items():
        _wait_http(f"{router}/health", 60, process)
        wait_healthy(router)
    return stack


def wait_healthy(router: str, timeout_s: float = 30) -> None:
    """Until every role has a ready worker: "ok", not "degraded" (also a 200, in which one
    role serves whole requests and nothing is handed over)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = httpx.get(f"{router}/health", timeout=5)
        if health.status_code == 200 and health.json()["status"] == "ok":
            return
        time.sleep(0.2)
    raise AssertionError(f"{router} not healthy after {timeout_s} s")


def member(failover: Failover, name: str) -> dict[str, Any]:
    """Worker ``name`` as the router's /health lists it (ready, in_flight, error)."""
    health = httpx.get(f"{failover.router}/health", timeout=5).json()
    role = "decode" if name == "decode" else "prefill"
    [found] = [b for b in health["roles"][role]["backends"] if b["url"] == failover.url(name)]
    return dict(found)


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in (labels or {}).items()):
                total += sample.value
    return total


def stream_body(max_tokens: int) -> dict[str, object]:
    return {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}


def events(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


def test_a_client_that_leaves_mid_stream_aborts_the_decode_request(failover: Failover) -> None:
    generated = "vllm:generation_tokens_total"
    before = metric(failover.url("decode"), generated)
    with httpx.stream("POST", f"{failover.router}/v1/completions", json=stream_body(1000),
                      headers={"X-Request-Id": "failover-leaves"}, timeout=60) as response:
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 5:
                break
    # The connection is closed: the router drops its connection to decode, and vLLM aborts.
    left = time.monotonic()
    log = failover.logs / "decode.log"
    # Generous: on a loaded 2-core machine the worker's output loop can lag by seconds, and
    # what is asserted is that the request is aborted rather than run to its 1000 tokens.
    deadline = left + 30
    while "Request cmpl-failover-leaves-0 aborted" not in log.read_text(errors="replace"):
        made = metric(failover.url("decode"), generated) - before
        assert made < 1000, f"decode ran the abandoned request to the end ({made:g} tokens)"
        assert time.monotonic() < deadline, "decode did not abort the abandoned request"
        time.sleep(0.1)
    print(f"decode aborted {time.monotonic() - left:.2f} s after the client left")
    time.sleep(1)
    assert metric(failover.url("decode"), generated) - before < 1000
    assert metric(failover.router, "pdserve_router_client_disconnects_total") >= 1


def test_a_client_that_leaves_during_prefill_never_reaches_decode(failover: Failover) -> None:
    decoded_before = metric(failover.url("decode"), "vllm:request_success_total")
    for name in ("prefill-a", "prefill-b"):
        failover.signal(name, signal.SIGSTOP)
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{failover.router}/v1/completions", timeout=1.0,
                       json={"model": "tiny", "prompt": PROMPT, "max_tokens": 8})
    finally:
        for name in ("prefill-a", "prefill-b"):
            failover.signal(name, signal.SIGCONT)
    wait_healthy(failover.router)
    time.sleep(1.0)  # time enough for a decode call, had the router gone on
    assert metric(failover.url("decode"), "vllm:request_success_total") == decoded_before
    assert metric(failover.url("decode"), "vllm:num_requests_running") == 0


def test_a_frozen_decode_ends_the_request_at_its_timeout(failover: Failover) -> None:
    failover.signal("decode", signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = httpx.post(f"{failover.short_router}/v1/completions", timeout=30,
                              json={"model": "tiny", "prompt": PROMPT, "max_tokens": 8})
        elapsed = time.monotonic() - started
    finally:
        failover.signal("decode", signal.SIGCONT)
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "request_timeout"
    assert elapsed < SHORT_TIMEOUT_S + 1
    wait_healthy(failover.short_router)


def test_a_decode_frozen_mid_stream_ends_the_stream_with_an_error_event(failover: Failover) -> None:
    lines: list[str] = []
    started = time.monotonic()
    with httpx.stream("POST", f"{failover.short_router}/v1/completions", json=stream_body(1000),
                      timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if len(events(lines)) == 3:
                failover.signal("decode", signal.SIGSTOP)
    elapsed = time.monotonic() - started
    failover.signal("decode", signal.SIGCONT)
    last = json.loads(events(lines)[-1])
    assert last["error"]["code"] == "decode_failed"
    assert "timed out" in last["error"]["message"]
    assert "[DONE]" not in events(lines)
    assert elapsed < SHORT_TIMEOUT_S + 1
    wait_healthy(failover.short_router)


def freeze_with_a_request_on_it(failover: Failover, name: str, attempts: int = 5) -> None:
    """SIGSTOP worker ``name`` with a request of the router's in flight on it.

    Frozen first, so that a request is surely in flight on it when it dies: the tiny model
    prefills in milliseconds, and a bare kill can land while it holds none. But a frozen worker
    leaves rotation after two missed probes (about 2 s), and when every client waits on a slow
    decode meanwhile, none picks it before that: then it is thawed, let back in, and frozen
    again."""
    for _ in range(attempts):
        failover.signal(name, signal.SIGSTOP)
        frozen = time.monotonic()
        while time.monotonic() - frozen < 10:
            state = member(failover, name)
            if state["in_flight"] > 0:
                return
            if not state["ready"]:
                break  # out of rotation before any request reached it
            time.sleep(0.02)
        failover.signal(name, signal.SIGCONT)
        back = time.monotonic()
        while not member(failover, name)["ready"]:
            assert time.monotonic() - back < 30, f"{name} not back in rotation once thawed"
            time.sleep(0.1)
    raise AssertionError(f"no request reached the frozen {name} worker in {attempts} tries")


def test_a_prefill_killed_under_load_is_retried_on_the_other_and_no_request_fails(
        failover: Failover) -> None:
    # (when it ended, status) of every request the clients made
    answers: list[tuple[float, int]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                response = http.post(f"{failover.router}/v1/completions",
                                     json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4})
                answers.append((time.monotonic(), response.status_code))

    retries_before = metric(failover.router, "pdserve_router_retries_total", {"role": "prefill"})
    threads = [threading.Thread(target=client, daemon=True) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        freeze_with_a_request_on_it(failover, "prefill-a")
        failover.signal("prefill-a", signal.SIGKILL)
        killed = time.monotonic()
        out_within = None
        while time.monotonic() - killed < 5:
            if not member(failover, "prefill-a")["ready"]:
                out_within = time.monotonic() - killed
                break
            time.sleep(0.05)
        time.sleep(2)
    finally:
        # Whatever failed above, the clients stop here: left running, they load the workers
        # (and this process's GIL) through every later test.
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert out_within is not None and out_within < 2, out_within
    statuses = [status for _, status in answers]
    assert set(statuses) == {200}, statuses
    # Traffic went on after the kill, on the other worker. (How much depends on how fast the
    # loaded machine is, so only that it did.)
    assert any(ended > killed for ended, _ in answers), answers
    assert metric(failover.router, "pdserve_router_retries_total",
                  {"role": "prefill"}) > retries_before
    # One prefill worker left: still ready for traffic.
    assert httpx.get(f"{failover.router}/health", timeout=5).status_code == 200


def test_a_decode_killed_mid_stream_is_continued_on_prefill_with_the_same_greedy_text(
        failover: Failover) -> None:
    """Issue 25: the stream goes on (request migration): with no other decode, a prefill
    worker continues from the prompt plus the tokens sent, and the client's greedy text equals
    an uninterrupted answer's (it was an SSE error event, then no [DONE], before)."""
    body = {**stream_body(48), "temperature": 0.0,
            "stream_options": {"include_usage": True}}

    def text(lines: list[str]) -> str:
        return "".join(c.get("text") or "" for e in events(lines) if e != "[DONE]"
                       for c in json.loads(e).get("choices") or [])

    whole: list[str] = []
    with httpx.stream("POST", f"{failover.router}/v1/completions", json=body,
                      timeout=60) as response:
        assert response.status_code == 200
        whole = list(response.iter_lines())
    migrated_before = metric(failover.router, "pdserve_router_migrations_total",
                             {"reason": "mid_stream", "role": "decode"})
    # The tiny model decodes 48 tokens in about 150 ms, and a loaded worker sends them in one
    # burst: a kill at the client's third event can come after the router had the whole
    # answer (then nothing is migrated). So decode is frozen at the third event, and killed
    # only if the stream then stalls; a stream that ends while decode is frozen was never cut,
    # and is tried again.
    for _ in range(5):
        lines: list[str] = []
        killed = threading.Event()

        def kill(killed: threading.Event = killed) -> None:
            killed.set()
            failover.signal("decode", signal.SIGKILL)

        timer = threading.Timer(1.0, kill)
        frozen = False
        started = time.monotonic()
        with httpx.stream("POST", f"{failover.router}/v1/completions", json=body,
                          timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if len(events(lines)) == 3 and not frozen:
                    frozen = True
                    failover.signal("decode", signal.SIGSTOP)
                    timer.start()
        timer.cancel()
        if killed.is_set():
            break
        # The whole answer had left decode before it froze.
        failover.signal("decode", signal.SIGCONT)
        wait_healthy(failover.router)
    assert killed.is_set(), "every stream ended before decode froze"
    assert time.monotonic() - started < 30
    assert events(lines)[-1] == "[DONE]", lines[-3:]
    assert not any('"error"' in e for e in events(lines))
    assert text(lines) == text(whole)
    parsed = [json.loads(e) for e in events(lines) if e != "[DONE]"]
    assert len({e["id"] for e in parsed}) == 1
    assert parsed[-1]["usage"]["completion_tokens"] == 48
    assert metric(failover.router, "pdserve_router_migrations_total",
                  {"reason": "mid_stream", "role": "decode"}) == migrated_before + 1
    # No decode worker left: the router says so, and prefill runs whole requests meanwhile
    # (degraded mode).
    deadline = time.monotonic() + 2
    while httpx.get(f"{failover.router}/health", timeout=5).json().get("degraded") != "decode":
        assert time.monotonic() < deadline, "router not degraded without a decode worker"
        time.sleep(0.05)
    degraded = metric(failover.router, "pdserve_router_degraded_total", {"missing_role": "decode"})
    response = httpx.post(f"{failover.router}/v1/completions", timeout=10,
                          json={"model": "tiny", "prompt": PROMPT, "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    assert metric(failover.router, "pdserve_router_degraded_total",
                  {"missing_role": "decode"}) == degraded + 1


def test_with_kv_load_failure_recompute_decode_answers_a_stale_hand_off(
        failover: Failover, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The plan's `kv_load_failure: recompute`: a NIXL decode worker that cannot load the KV a
    (stand-in) prefill announced computes the prompt itself, and the client gets its answer.
    (With the default, `fail`, tests/nodes/test_two_nodes.py sees a 502 `kv_handoff_failed`.)"""
    root = tmp_path_factory.mktemp("recompute")
    model = shared_tiny_llama(model_dir)
    decode_port, stale_prefill_port, router_port = free_port(), free_port(), free_port()
    argv, env = build_command(WorkerSpec(
        role="decode", model_path=str(model), served_model_name="tiny", port=decode_port,
        max_model_len=2048, kv_channel="nixl", side_channel_port=free_port(), cpu_cores=(1,),
        dtype="float32", cache_dir=str(TEST_CACHE_DIR), enforce_eager=True, kv_load_failure="recompute",
    ))
    log = open(root / "decode.log", "wb")  # noqa: SIM115 - closed below
    decode = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    # Nothing listens on the announced side channel: the hand-off cannot succeed.
    stub = StaleHandoffPrefill(stale_prefill_port, model, side_port=free_port())
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    router = subprocess.Popen(
        [sys.executable, "-m", "inference.router", "--served-model-name", "tiny",
         "--tokenizer", str(model), "--max-model-len", "2048", "--kv-channel", "nixl",
         "--port", str(router_port),
         "--prefill", f"http://127.0.0.1:{stale_prefill_port}",
         "--decode", f"http://127.0.0.1:{decode_port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"http://127.0.0.1:{decode_port}/health", START_TIMEOUT_S, decode)
        wait_healthy(f"http://127.0.0.1:{router_port}")
        response = httpx.post(f"http://127.0.0.1:{router_port}/v1/completions",
                              timeout=120, json={"model": "tiny", "prompt": PROMPT,
                                                 "max_tokens": 8, "ignore_eos": True})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 8
    finally:
        for process in (router, decode):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        stub.shutdown()
        stub.server_close()
