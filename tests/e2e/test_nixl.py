"""The NIXL channel end to end: real vLLM prefill and decode workers with NixlConnector (UCX
over TCP on loopback), started from pdserve's launch specs, behind pdserve's router.

Runs after the default deployment's tests (file order): it needs those cores to itself, since
NIXL's progress thread busy-polls about one core per idle worker. A decode restarted while
prefill holds its KV is tests/nodes/test_two_nodes.py's, across two nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from inference.launch import WorkerSpec, build_command
from tests.console.sockets import free_port
from tests.e2e.conftest import START_TIMEOUT_S, Stack, _wait_http
from tests.e2e.stale_prefill import StaleHandoffPrefill
from tests.e2e.test_default_deployment import LONG_PROMPT
from tests.e2e.test_listening_sockets import assert_bound_within, bound_sockets
from tests.tiny_llama import TEST_CACHE_DIR

pytestmark = pytest.mark.vllm


@dataclass(frozen=True)
class NixlPair:
    router: str
    decode: str
    logs: Path
    # The pair's session leaders: prefill, decode and router, each with its children.
    pids: tuple[int, ...]
    # Prefill's, then decode's.
    side_channel_ports: tuple[int, int]
    # The router's /health the first time it said "ok" (later ones may show a pair warmed
    # again: a worker that missed probes under load leaves rotation and is warmed on return).
    first_ok_health: dict[str, Any] = field(default_factory=dict)

    @property
    def prefill_side_port(self) -> int:
        return self.side_channel_ports[0]


@pytest.fixture(scope="module")
def nixl_pair(stack: Stack, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[NixlPair]:
    # NIXL's busy-polling workers need the cores: the default deployment goes first (its last
    # test stops it; stop it here when this file runs alone).
    default = stack.deployment()
    if default["state"] != "stopped":
        with stack.api() as client:
            client.post(f"/api/v1/deployments/{stack.deployment_id}/stop").raise_for_status()
        stack.wait_for_state("stopped", timeout_s=60)
    logs = tmp_path_factory.mktemp("nixl")
    processes: list[subprocess.Popen[bytes]] = []
    handles = []
    # Ports from the kernel, never fixed ones: another process holding a fixed port (a
    # benchmark, say) would answer this test's requests in its workers' place.
    prefill_port, decode_port, router_port = free_port(), free_port(), free_port()
    prefill_side, decode_side = free_port(), free_port()
    commands = {}
    for role, port, core, side in (("prefill", prefill_port, 0, prefill_side),
                                   ("decode", decode_port, 1, decode_side)):
        # The default deployment's dtype: the output is compared with the stack's reference,
        # which computes in it (float32 here against a bfloat16 reference differed from the
        # first token).
        commands[role] = build_command(WorkerSpec(
            role=role, model_path=str(model_dir), served_model_name="smollm2", port=port,
            max_model_len=2048, kv_channel="nixl", side_channel_port=side, cpu_cores=(core,),
            dtype=default["dtype"], sampling_defaults=default["sampling_defaults"],
            cache_dir=str(TEST_CACHE_DIR), enforce_eager=True,
        ))

    def spawn(role: str) -> subprocess.Popen[bytes]:
        argv, env = commands[role]
        handle = open(logs / f"{role}.log", "ab")  # noqa: SIM115 - closed in teardown
        handles.append(handle)
        process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(process)
        return process

    for role in ("prefill", "decode"):
        spawn(role)
    router_log = open(logs / "router.log", "wb")  # noqa: SIM115
    handles.append(router_log)
    processes.append(subprocess.Popen(
        [sys.executable, "-m", "inference.router", "--served-model-name", "smollm2",
         "--tokenizer", str(model_dir), "--max-model-len", "2048", "--kv-channel", "nixl",
         "--port", str(router_port), "--prefill", f"http://127.0.0.1:{prefill_port}",
         "--decode", f"http://127.0.0.1:{decode_port}", "--kv-warmup-tokens", "256"],
        stdout=router_log, stderr=subprocess.STDOUT, start_new_session=True))
    pair = NixlPair(router=f"http://127.0.0.1:{router_port}",
                    decode=f"http://127.0.0.1:{decode_port}", logs=logs, pids=tuple(p.pid for p in processes),
                    side_channel_ports=(prefill_side, decode_side))
    try:
        for port, process in ((prefill_port, processes[0]), (decode_port, processes[1])):
            _wait_http(f"http://127.0.0.1:{port}/health", START_TIMEOUT_S, process)
        # Healthy once its warm-up hand-off went through: NIXL's first handshake included.
        health = _wait_router_ok(pair.router, 300, processes[2])
        yield replace(pair, first_ok_health=health)
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        for handle in handles:
            handle.close()


def test_nixl_pd_output_equals_prefix_cached_single_server(nixl_pair: NixlPair,
                                                           stack: Stack) -> None:
    router, logs = nixl_pair.router, nixl_pair.logs
    body = {"model": "smollm2", "prompt": LONG_PROMPT, "max_tokens": 24,
            "return_token_ids": True, "temperature": 0}
    pd = httpx.post(f"{router}/v1/completions", json=body, timeout=300,
                    headers={"X-Request-Id": "nixl-equality"})
    assert pd.status_code == 200, f"{pd.text}\n{_worker_trouble(logs)}"
    httpx.post(f"{stack.reference}/v1/completions", json=body, timeout=120)
    single = httpx.post(f"{stack.reference}/v1/completions", json=body, timeout=120).json()
    assert pd.json()["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]
    assert _metric_at(router, "pdserve_router_pd_fallback_total") == 0
    # The hand-off really went through NIXL: prefill named its engine and blocks for decode.
    [line] = [json.loads("{" + text.split("timeline {", 1)[1])
              for text in (logs / "router.log").read_text().splitlines()
              if "nixl-equality" in text and "timeline {" in text]
    assert line["kv"]["remote_engine_id"]
    assert line["kv"]["remote_num_tokens"] > 256


def test_the_router_handed_kv_over_once_before_it_reported_healthy(nixl_pair: NixlPair) -> None:
    [pair] = nixl_pair.first_ok_health["kv_warmup"]
    assert pair["state"] == "warm" and pair["decode"] == nixl_pair.decode
    router_log = (nixl_pair.logs / "router.log").read_text()
    assert "hand-off of 256 tokens done" in router_log, router_log[-2000:]


def test_the_nixl_pair_listens_on_loopback_only(nixl_pair: NixlPair) -> None:
    # NIXL opens more than the shared-storage channel: side channels and UCX listeners, in the
    # workers and in vLLM's engine cores (children of the session leaders).
    tree = set(nixl_pair.pids)
    for pid in nixl_pair.pids:
        tree |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    sockets = bound_sockets(tree)
    assert_bound_within(sockets, {"127.0.0.1"})
    ports = {port for *_, port in sockets}
    assert set(nixl_pair.side_channel_ports) <= ports, \
        f"side channels {nixl_pair.side_channel_ports} not among {sorted(ports)}"
    print(f"\nNIXL: {len(sockets)} bound sockets of {len(tree)} processes:")
    for entry in sorted(sockets, key=lambda s: s[3]):
        print("  ", *entry)


def test_nixl_chat_streams_through_the_router(nixl_pair: NixlPair) -> None:
    router, logs = nixl_pair.router, nixl_pair.logs
    with httpx.stream("POST", f"{router}/v1/chat/completions", timeout=300, json={
            "model": "smollm2", "stream": True, "max_tokens": 16,
            "messages": [{"role": "user", "content": LONG_PROMPT}]}) as response:
        assert response.status_code == 200, _worker_trouble(logs)
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert not any('"error"' in event for event in events)


def test_a_failed_kv_load_at_decode_is_a_clear_502_and_decode_stays_healthy(
        nixl_pair: NixlPair, model_dir: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    router, logs = nixl_pair.router, nixl_pair.logs
    stale_prefill_port, stale_router_port = free_port(), free_port()
    stub = StaleHandoffPrefill(stale_prefill_port, model_dir, side_port=nixl_pair.prefill_side_port)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    log = open(tmp_path_factory.mktemp("stale") / "router.log", "wb")  # noqa: SIM115
    stale_router = subprocess.Popen(
        [sys.executable, "-m", "inference.router", "--served-model-name", "smollm2",
         "--tokenizer", str(model_dir), "--max-model-len", "2048", "--kv-channel", "nixl",
         "--port", str(stale_router_port), "--prefill", f"http://127.0.0.1:{stale_prefill_port}",
         "--decode", nixl_pair.decode],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # A router starts in seconds, but with the pair's two NIXL workers busy-polling both
        # cores it took over 30 s here (its log still empty).
        _wait_router_ok(f"http://127.0.0.1:{stale_router_port}", 120, stale_router)
        started = time.monotonic()
        response = httpx.post(f"http://127.0.0.1:{stale_router_port}/v1/completions", timeout=120,
                              json={"model": "smollm2", "prompt": LONG_PROMPT, "max_tokens": 8})
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "kv_handoff_failed"
        assert f"127.0.0.1:{stale_prefill_port}" in error["message"]
        assert time.monotonic() - started < 60
    finally:
        os.killpg(stale_router.pid, signal.SIGKILL)
        stale_router.wait()
        log.close()
        stub.shutdown()
        stub.server_close()
    # The decode worker survived the failed load and still serves real hand-offs.
    assert httpx.get(f"{nixl_pair.decode}/health", timeout=10).status_code == 200
    ok = httpx.post(f"{router}/v1/completions", timeout=300,
                    json={"model": "smollm2", "prompt": LONG_PROMPT, "max_tokens": 8})
    assert ok.status_code == 200, f"{ok.text}\n{_worker_trouble(logs)}"


def _wait_router_ok(router: str, timeout_s: float,
                    process: subprocess.Popen[bytes] | None = None) -> dict[str, Any]:
    """Until the router's /health says "ok": both roles ready and a pair warm. (It answers 200
    "degraded" while one role is missing, and those requests would not be handed over.)
    Returns that first "ok" answer."""
    _wait_http(f"{router}/health", timeout_s, process)
    deadline = time.monotonic() + timeout_s
    while (health := httpx.get(f"{router}/health", timeout=10).json())["status"] != "ok":
        assert time.monotonic() < deadline, f"{router} not ok after {timeout_s} s"
        time.sleep(0.2)
    return health


def _worker_trouble(logs: Path) -> str:
    """The workers' warnings and errors, for a failed hand-off's assertion message: which side
    gave up (handshake, transfer, expired lease) is in there, and nowhere else."""
    lines = []
    for role in ("prefill", "decode"):
        for line in (logs / f"{role}.log").read_text(errors="replace").splitlines():
            if " WARNING " in line or " ERROR " in line or "Traceback" in line:
                lines.append(f"{role}: {line}")
    return "\n".join(lines[-60:])


def _metric_at(router: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(f"{router}/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total
