"""Two nodes on one machine, each a network namespace with its own address and its own agent
(``manage.py agent --node``), behind one console on PostgreSQL and Redis: prefill on node A,
decode on node B, KV over NIXL across the veths (tests/netns.py builds the hosts).

One deployment of the tiny random-weight Llama serves every test here, in file order: the
agents register, a Start reaches node B's agent on its queue, the output equals a single
server's and the KV crossed B's veth, B's agent stops (B is marked down, its decode serves on:
fencing) and starts again (it adopts the decode), and B's supervisor restarts a SIGKILLed decode.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest
import redis

from inference.router.handoff import NIXL_PREFILL_PARAMS
from inference.router.upstream import prompt_token_ids
from inference.worker_auth import ROUTER_WORKER_KEY_ENV
from tests.console.sockets import free_port, wait_for
from tests.console_api import ConsoleApi, admin_token, spawn_console
from tests.e2e.stale_prefill import StaleHandoffPrefill
from tests.netns import Host, Hosts
from tests.tiny_llama import build_tiny_llama
from tests.worker_key import worker_headers

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = Path(os.environ.get("PDSERVE_TEST_MODEL_DIR",
                              REPO / "data" / "models" / "smollm2-135m-instruct"))
ADMIN_PASSWORD = "two-nodes-admin-password"
POSTGRES, REDIS_PORT = 5432, 6379
# A heartbeat a second and a 5 s grace: the test sees a node go down in seconds, not the
# production default's 30 s (console/settings.py says why 30).
HEARTBEAT_MS, GRACE_MS = 1000, 5000
NAME = "two-nodes"
# Prompt long enough that its KV (2 layers x K,V x 1 head x 64 x fp32 = 1 KiB a token) is
# far more than the request itself on the veth.
LONG_PROMPT = " ".join(f"word{i}" for i in range(300))  # about 1,200 tokens


@dataclass
class TwoNodes(ConsoleApi):
    hosts: Hosts
    data_dir: Path
    env: dict[str, str]
    console: str
    token: str = ""
    deployment: int = 0
    router: str = ""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Measured by the tests, printed at the end of the module.
    report: dict[str, float] = field(default_factory=dict)

    def node_env(self, host: Host) -> dict[str, str]:
        """A node's environment: the console's database and Redis through the bridge, a data
        directory of its own (its logs, its lock), as on a machine of its own."""
        bridge = self.hosts.bridge_address
        return {**self.env,
                "DATABASE_URL": self.env["DATABASE_URL"].replace("127.0.0.1", bridge),
                "REDIS_URL": self.env["REDIS_URL"].replace("127.0.0.1", bridge),
                "PDSERVE_DATA_DIR": str(self.data_dir / host.name)}

    def start_agent(self, name: str) -> subprocess.Popen[bytes]:
        host = self.hosts[name]
        (self.data_dir / name).mkdir(exist_ok=True)
        log = open(self.data_dir / f"agent-{name}.log", "ab")  # noqa: SIM115 - closed with it
        agent = host.popen([sys.executable, "manage.py", "agent", "--node", name],
                           env=self.node_env(host), cwd=REPO, stdout=log,
                           stderr=subprocess.STDOUT)
        self.processes[f"agent-{name}"] = agent
        return agent

    def worker_headers(self) -> dict[str, str]:
        return worker_headers(self.data_dir, NAME, self.env)

    def get(self, path: str, **params: Any) -> Any:
        response = self.call("GET", path, params=params)
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text}"
        return response.json()

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.get("/api/v1/nodes/")["results"] if n["name"] == name)

    def agent_state(self, name: str) -> str | None:
        agent = self.node(name)["agent"]
        return agent["state"] if agent else None

    def process(self, slot: str) -> dict[str, Any]:
        body = self.get(f"/api/v1/deployments/{self.deployment}/")
        return next(p for p in body["processes"] if p["slot"] == slot)

    def chat(self, content: str, max_tokens: int = 8, url: str | None = None) -> str:
        # A worker (url given) wants the deployment's key; the router none here.
        response = httpx.post(f"{url or self.router}/v1/chat/completions", timeout=120,
                              headers=self.worker_headers() if url else {}, json={
            "model": NAME, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}]})
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])


def netns_of(pid: int) -> str:
    """The network namespace a process runs in, by name (``ip netns identify``)."""
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True,
                          check=True).stdout.strip()


def rx_bytes(host: Host) -> int:
    return int(host.run(["cat", f"/sys/class/net/{host.interface}/statistics/rx_bytes"]).stdout)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    data_dir = tmp_path_factory.mktemp("two-nodes")
    model = build_tiny_llama(SMOLLM2, data_dir / "tiny", layers=2, dtype="float32")
    database = f"pdserve_nodes_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{POSTGRES}/postgres",
                         autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    redis_db = 11
    redis.Redis(port=REDIS_PORT, db=redis_db).flushdb()
    env = {**os.environ, "PDSERVE_DATA_DIR": str(data_dir),
           "DATABASE_URL": f"postgres://postgres@127.0.0.1:{POSTGRES}/{database}",
           "REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/{redis_db}",
           "DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD,
           # Shared by the console and every agent, as in production: the workers' keys derive
           # from it where they start (the agent) and where they are called (router, collector).
           "PDSERVE_SECRET_KEY": f"two-nodes-{uuid.uuid4().hex}",
           "PDSERVE_AGENT_HEARTBEAT_MS": str(HEARTBEAT_MS), "PDSERVE_AGENT_GRACE_MS": str(GRACE_MS),
           "PDSERVE_ALERT_TICK_MS": "1000"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO,
                   env=env, check=True)
    subprocess.run([sys.executable, "manage.py", "createsuperuser", "--noinput", "--username",
                    "admin", "--email", ""], cwd=REPO, env=env, check=True, capture_output=True)
    with Hosts(["node-a", "node-b"], forwards=[POSTGRES, REDIS_PORT]) as hosts:
        port = free_port()
        cluster = TwoNodes(hosts=hosts, data_dir=data_dir, env=env,
                           console=f"http://127.0.0.1:{port}")
        cluster.processes.update(spawn_console(env, data_dir, port))
        try:
            cluster.token = admin_token(cluster.console, ADMIN_PASSWORD)
            with cluster.api() as client:
                client.post("/api/v1/models/", json={"name": "tiny"}).raise_for_status()
                client.post("/api/v1/variants/", json={"base_model": "tiny", "name": "fp32",
                                                       "path": str(model)}).raise_for_status()
                for host in hosts:
                    client.post("/api/v1/nodes/", json={
                        "name": host.name, "address": host.address, "cpu_count": 2,
                        "memory_gib": 8}).raise_for_status()
            yield cluster
        finally:
            _stop(cluster)
            print("\ntwo nodes:", json.dumps(cluster.report, indent=1))
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{POSTGRES}/postgres",
                         autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _stop(cluster: TwoNodes) -> None:
    """The deployment stopped through the console (the agents stop their workers), then every
    process; Hosts kills whatever is left in the namespaces."""
    if cluster.deployment:
        cluster.call("POST", f"/api/v1/deployments/{cluster.deployment}/stop")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            body = cluster.call("GET", f"/api/v1/deployments/{cluster.deployment}/").json()
            if all(p["state"] in ("stopped", "failed") for p in body.get("processes", [])):
                break
            time.sleep(0.5)
    for process in cluster.processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in cluster.processes.values():
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_each_nodes_agent_registers_and_reports_its_devices(two_nodes: TwoNodes) -> None:
    for name in ("node-a", "node-b"):
        two_nodes.start_agent(name)
    wait_for(lambda: all(two_nodes.agent_state(n) == "up" for n in ("node-a", "node-b")),
             "both agents up", 60, interval=0.5)
    # Discovered by the agent on its node (the form said 8 GiB; the machine has more).
    wait_for(lambda: two_nodes.node("node-b")["engine_version"] != "", "node-b's discovery",
             30, interval=0.5)
    node_b = two_nodes.node("node-b")
    assert node_b["memory_gib"] != 8 and node_b["agent"]["heartbeat"]["node"] == "node-b"
    status = subprocess.run([sys.executable, "manage.py", "agent", "--node", "node-b",
                             "--status"], cwd=REPO, env=two_nodes.env, capture_output=True,
                            text=True, check=True).stdout
    assert status.startswith(f"node node-b ({two_nodes.hosts['node-b'].address}): agent up")


def test_a_start_runs_prefill_on_node_a_and_decode_on_node_b(two_nodes: TwoNodes) -> None:
    created = two_nodes.call("POST", "/api/v1/deployments/", json={
        "name": NAME, "base_model": "tiny", "served_model_name": NAME, "max_model_len": 2048,
        "longest_request": 2048, "kv_cache_gib": 1, "dtype": "float32", "kv_channel": "nixl",
        "sampling_defaults": {"temperature": 0},
        "prefill": {"variant": "tiny/fp32", "instances": [
            {"node": "node-a", "cpu_cores": "0", "port": free_port()}]},
        "decode": {"variant": "tiny/fp32", "instances": [
            {"node": "node-b", "cpu_cores": "1", "port": free_port()}]},
        "router": {"port": free_port()},
    })
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["checks"]["ok"], body["checks"]
    reach = next(c for c in body["checks"]["checks"] if c["id"] == "node.reach")
    # Probed by the agents: node-b's decode to node-a's side channel, the router to prefill.
    assert reach["status"] == "pass", reach
    assert "decode-0 on node-b reaches prefill-0:" in reach["summary"], reach
    assert "the router on " in reach["summary"]
    assert f"UCX tcp,self on {two_nodes.hosts['node-b'].interface}" in reach["summary"]
    two_nodes.deployment = body["id"]
    two_nodes.router = body["router_url"]
    clicked = time.monotonic()
    started = two_nodes.call("POST", f"/api/v1/deployments/{two_nodes.deployment}/start")
    assert started.status_code < 300, started.text

    def spawned() -> bool:
        return any(p["slot"] == "decode-0" and p["pid"] for p in two_nodes.get(
            f"/api/v1/deployments/{two_nodes.deployment}/")["processes"])

    wait_for(spawned, "decode-0 started on node-b", 30, interval=0.05)
    two_nodes.report["control latency: Start -> decode started on node-b (s)"] = round(
        time.monotonic() - clicked, 3)
    wait_for(lambda: two_nodes.get(f"/api/v1/deployments/{two_nodes.deployment}/")["state"]
             == "ready", "the deployment ready", 420, interval=1.0)
    prefill, decode = two_nodes.process("prefill-0"), two_nodes.process("decode-0")
    assert netns_of(prefill["pid"]) == two_nodes.hosts["node-a"].netns
    assert netns_of(decode["pid"]) == two_nodes.hosts["node-b"].netns
    assert netns_of(two_nodes.process("router")["pid"]) == ""  # the console's own node


def test_each_nodes_agent_verified_the_model_files_there(two_nodes: TwoNodes) -> None:
    def model_path() -> dict[str, Any]:
        report = two_nodes.call("POST", f"/api/v1/deployments/{two_nodes.deployment}/check")
        assert report.status_code == 200, report.text
        return next(c for c in report.json()["checks"] if c["id"] == "model.path")

    wait_for(lambda: model_path()["status"] == "pass", "model.path verified on both nodes", 60,
             interval=1.0)
    summary = model_path()["summary"]
    assert "on node-a (verified by its agent, sha256 " in summary, summary
    assert "on node-b (verified by its agent, sha256 " in summary, summary


def test_the_output_equals_a_single_servers_and_the_kv_crossed_the_veth(
        two_nodes: TwoNodes) -> None:
    node_b = two_nodes.hosts["node-b"]
    before = rx_bytes(node_b)
    began = time.monotonic()
    pd = two_nodes.chat(LONG_PROMPT)
    two_nodes.report["PD request, 300-word prompt over the veth (s)"] = round(
        time.monotonic() - began, 3)
    received = rx_bytes(node_b) - before
    # Decode alone computes the whole request: a single server of the same weights.
    decode_url = f"http://{node_b.address}:{two_nodes.process('decode-0')['port']}"
    single = two_nodes.chat(LONG_PROMPT, url=decode_url)
    assert pd == single
    prompt_tokens = httpx.post(f"{decode_url}/tokenize", headers=two_nodes.worker_headers(), json={
        "model": NAME, "messages": [{"role": "user", "content": LONG_PROMPT}]}).json()["count"]
    kv_bytes = prompt_tokens * 2 * 2 * 64 * 4  # layers x K,V x head dim x fp32, one KV head
    two_nodes.report["KV bytes of the prompt"] = kv_bytes
    two_nodes.report["bytes node-b received during the PD request"] = received
    assert received >= 0.9 * kv_bytes, (received, kv_bytes)


def test_the_router_warmed_the_cross_node_pair_before_it_reported_healthy(
        two_nodes: TwoNodes) -> None:
    health = httpx.get(f"{two_nodes.router}/health", timeout=10).json()
    decode_url = f"http://{two_nodes.hosts['node-b'].address}:{two_nodes.process('decode-0')['port']}"
    [pair] = health["kv_warmup"]
    assert pair["state"] == "warm" and pair["decode"] == decode_url, health


def test_each_node_listens_on_its_own_address_and_loopback_only(two_nodes: TwoNodes) -> None:
    """Workers, NIXL's side channels and UCX bind the node's address, never every address."""
    for host in two_nodes.hosts:
        listening = host.run(["ss", "-Htuln"]).stdout.split("\n")
        addresses = {line.split()[4].rsplit(":", 1)[0].strip("[]") for line in listening
                     if line.strip()}
        assert addresses, f"nothing listens in {host.name}"
        assert addresses <= {host.address, "127.0.0.1", "::1"}, (host.name, listening)
    side = two_nodes.get(f"/api/v1/deployments/{two_nodes.deployment}/")["workers"]
    node_a = two_nodes.hosts["node-a"]
    prefill_side = next(w["side_channel_port"] for w in side if w["slot"] == "prefill-0")
    assert node_a.listening(prefill_side), "prefill's NIXL side channel is not on node-a"


def test_chat_streams_through_the_router_across_nodes(two_nodes: TwoNodes) -> None:
    with httpx.stream("POST", f"{two_nodes.router}/v1/chat/completions", timeout=300, json={
            "model": NAME, "stream": True, "max_tokens": 16,
            "messages": [{"role": "user", "content": LONG_PROMPT}]}) as response:
        assert response.status_code == 200
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert not any('"error"' in event for event in events)


def test_a_failed_kv_load_at_decode_is_a_clear_502_and_decode_stays_healthy(
        two_nodes: TwoNodes) -> None:
    """A stand-in prefill announces blocks at an address node-b cannot load them from."""
    decode_url = f"http://{two_nodes.hosts['node-b'].address}:{two_nodes.process('decode-0')['port']}"
    model = two_nodes.data_dir / "tiny"
    stub_port, router_port = free_port(), free_port()
    stub = StaleHandoffPrefill(stub_port, model, side_port=free_port())
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    log = open(two_nodes.data_dir / "stale-router.log", "wb")  # noqa: SIM115 - closed below
    stale_router = subprocess.Popen(
        [sys.executable, "-m", "inference.router", "--served-model-name", NAME,
         "--tokenizer", str(model), "--max-model-len", "2048", "--kv-channel", "nixl",
         "--port", str(router_port), "--prefill", f"http://127.0.0.1:{stub_port}",
         "--decode", decode_url], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        # The deployment's worker key, which the real decode refuses to serve without.
        env={**os.environ, ROUTER_WORKER_KEY_ENV: two_nodes.worker_headers()[
            "Authorization"].removeprefix("Bearer ")},
        start_new_session=True)
    try:
        def ok() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{router_port}/health",
                                 timeout=5).json().get("status") == "ok"
            except (httpx.HTTPError, ValueError):
                return False

        wait_for(ok, "the stale router ok", 120, interval=0.5)
        started = time.monotonic()
        response = httpx.post(f"http://127.0.0.1:{router_port}/v1/completions", timeout=120,
                              json={"model": NAME, "prompt": LONG_PROMPT, "max_tokens": 8})
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "kv_handoff_failed"
        assert f"127.0.0.1:{stub_port}" in error["message"]
        assert time.monotonic() - started < 60
    finally:
        os.killpg(stale_router.pid, signal.SIGKILL)
        stale_router.wait()
        log.close()
        stub.shutdown()
        stub.server_close()
    # The decode worker survived the failed load and still serves real hand-offs.
    assert httpx.get(f"{decode_url}/health", timeout=10).status_code == 200
    assert two_nodes.chat("after a failed load") != ""


def test_a_stopped_agent_marks_its_node_down_and_its_decode_serves_on(two_nodes: TwoNodes) -> None:
    decode_pid = two_nodes.process("decode-0")["pid"]
    agent = two_nodes.processes["agent-node-b"]
    agent.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    agent.wait(timeout=30)
    assert psutil.pid_exists(decode_pid), "the agent took its decode worker with it"
    wait_for(lambda: two_nodes.agent_state("node-b") == "down", "node-b marked down",
             GRACE_MS / 1000 + 15, interval=0.25)
    two_nodes.report["detection: agent stopped -> node marked down (s)"] = round(
        time.monotonic() - stopped, 2)
    two_nodes.report["heartbeat interval / grace (s)"] = f"{HEARTBEAT_MS / 1000} / {GRACE_MS / 1000}"

    def fired() -> bool:
        alerts = two_nodes.get("/api/v1/alerts/", deployment=NAME)["results"]
        return any(a["labels"].get("rule") == "node_down" and a["state"] == "firing"
                   for a in alerts)

    wait_for(fired, "the node_down alert firing", 30, interval=0.5)
    # Fencing: nobody supervises the decode now, and it serves all the same.
    assert two_nodes.chat("still there?") != ""
    assert two_nodes.agent_state("node-a") == "up"


def test_a_restarted_agent_adopts_its_running_decode(two_nodes: TwoNodes) -> None:
    decode_pid = two_nodes.process("decode-0")["pid"]
    two_nodes.start_agent("node-b")
    wait_for(lambda: two_nodes.agent_state("node-b") == "up", "node-b up again", 60,
             interval=0.5)
    log = (two_nodes.data_dir / "agent-node-b.log").read_text(errors="replace")
    wait_for(lambda: "settled 1 process record" in (two_nodes.data_dir / "agent-node-b.log")
             .read_text(errors="replace"), "the agent's adoption line", 30, interval=0.5)
    decode = two_nodes.process("decode-0")
    assert decode["pid"] == decode_pid and decode["state"] == "ready", (decode, log[-2000:])
    # Never a duplicate: one vLLM server process in node-b.
    servers = [p for p in map(psutil.Process, two_nodes.hosts["node-b"].pids())
               if "serve" in " ".join(p.cmdline()) and "vllm" in " ".join(p.cmdline())]
    assert [p.pid for p in servers] == [decode_pid]
    assert two_nodes.chat("and now?") != ""


def test_node_bs_supervisor_restarts_a_killed_decode_and_a_stale_announcement_fails_cleanly(
        two_nodes: TwoNodes) -> None:
    """B's supervisor restarts a SIGKILLed decode in node-b. Meanwhile prefill holds blocks
    announced for the dead decode engine, the failure class of vLLM issue #49238: the router
    takes decode out at once and warms the new pair, the stale announcement fails cleanly on the
    new decode (it stays healthy), and real hand-offs go through again."""
    decode = two_nodes.process("decode-0")
    prefill = two_nodes.process("prefill-0")
    prefill_url = f"http://{two_nodes.hosts['node-a'].address}:{prefill['port']}"
    # What the router's first call does: prefill keeps the KV for a remote decode (its lease).
    held = httpx.post(f"{prefill_url}/v1/completions", timeout=120,
                      headers=two_nodes.worker_headers(), json={
        "model": NAME, "prompt": LONG_PROMPT, "max_tokens": 1, "stream": False,
        "return_token_ids": True, "kv_transfer_params": dict(NIXL_PREFILL_PARAMS)})
    assert held.status_code == 200, held.text
    announced = held.json()["kv_transfer_params"]
    assert announced["remote_block_ids"], announced

    os.killpg(decode["pid"], signal.SIGKILL)
    killed = time.monotonic()
    while httpx.get(f"{two_nodes.router}/health", timeout=5).json()["roles"]["decode"]["ready"]:
        assert time.monotonic() - killed < 5, "the router still counts the killed decode ready"
        time.sleep(0.05)
    wait_for(lambda: two_nodes.process("decode-0")["pid"] not in (None, decode["pid"]),
             "decode-0 started again", 60, interval=0.5)
    restarted = two_nodes.process("decode-0")
    assert netns_of(restarted["pid"]) == two_nodes.hosts["node-b"].netns
    assert restarted["restarts"] == decode["restarts"] + 1
    wait_for(lambda: two_nodes.get(f"/api/v1/deployments/{two_nodes.deployment}/")["state"]
             == "ready", "the deployment ready again", 300, interval=1.0)
    two_nodes.report["SIGKILL decode -> serving again (s)"] = round(time.monotonic() - killed, 1)

    decode_url = f"http://{two_nodes.hosts['node-b'].address}:{restarted['port']}"
    # (Decode's prompt must be exactly prefill's tokens: a longer one kills a NIXL decode.)
    prompt = prompt_token_ids("completions", held.json())
    assert prompt, held.json()
    stale = httpx.post(f"{decode_url}/v1/completions", timeout=120,
                       headers=two_nodes.worker_headers(), json={
        "model": NAME, "prompt": prompt, "max_tokens": 4, "kv_transfer_params": announced})
    assert stale.status_code in (200, 500), stale.text
    assert httpx.get(f"{decode_url}/health", timeout=10).status_code == 200
    assert two_nodes.chat(LONG_PROMPT) == two_nodes.chat(LONG_PROMPT, url=decode_url)


def test_a_planned_port_taken_on_the_other_node_is_found_by_its_agent(two_nodes: TwoNodes) -> None:
    node_a = two_nodes.hosts["node-a"]
    holder = node_a.popen([sys.executable, "-c", "import socket, sys, time; s = socket.create_server"
                           f"(('{node_a.address}', 0)); print(s.getsockname()[1], flush=True); "
                           "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        taken = int(holder.stdout.readline())
        created = two_nodes.call("POST", "/api/v1/deployments/", json={
            "name": "two-nodes-taken", "base_model": "tiny", "served_model_name": "taken",
            "max_model_len": 2048, "longest_request": 2048, "kv_cache_gib": 1,
            "dtype": "float32", "kv_channel": "nixl",
            "prefill": {"variant": "tiny/fp32", "instances": [
                {"node": "node-a", "cpu_cores": "0", "port": taken}]},
            "decode": {"variant": "tiny/fp32", "instances": [
                {"node": "node-b", "cpu_cores": "1", "port": free_port()}]},
            "router": {"port": free_port()},
        })
        assert created.status_code == 201, created.text
        reach = next(c for c in created.json()["checks"]["checks"] if c["id"] == "node.reach")
        assert reach["status"] == "error", reach
        assert any(f"port {taken} of prefill-0 is taken on node node-a" in r["message"]
                   for r in reach["results"]), reach
        two_nodes.call("DELETE", f"/api/v1/deployments/{created.json()['id']}/")
    finally:
        holder.kill()
        holder.wait()
