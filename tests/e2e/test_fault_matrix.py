"""The fault matrix: one fault per case, injected into real processes under a load of four
concurrent clients, with what the issue requires asserted and three numbers recorded.

The numbers: detection (fault injected -> the router's /health or the console's process table
shows it), recovery (fault -> the process is back ready, or requests succeed again) and the
failed / sent requests of the load. The table is written to ``fault-matrix.md`` and ``.json``
under pytest's base temp directory and printed at the end, for the README.

The cases borrow the session's tiny-model 1P1D deployment (tests/borrowed.py): its console, its
supervisor (under ``manage.py up``), its workers and its router. Cases about workers and the KV
directory send their load through a router of their own in front of the borrowed workers, with
``--pd-policy remote``: the deployment's router (``pd_adaptive``) prefills the tiny model's
prompts on decode, so nothing would be in flight on prefill or handed over as KV.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from inference.process_groups import kill_group
from inference.router.keys import key_hash, new_key, public_prefix
from tests.borrowed import NAME, Handle
from tests.console.sockets import free_port
from tests.e2e.doctor import wait_for_symptom
from tests.e2e.fault_harness import (
    BACK_TIMEOUT_S,
    Load,
    failed,
    first_ok_started_after,
    listeners,
    member,
    planned_pids,
    quiet,
    ready_again,
    router_of_its_own,
    up_child,
    wait_for,
    worker_url,
)
from tests.e2e.test_failover import PROMPT, events, metric

pytestmark = pytest.mark.vllm

@dataclass
class Row:
    fault: str
    detection_s: float | None
    recovery_s: float | None
    failed: int
    sent: int
    note: str = ""


ROWS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def table(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    if not ROWS:
        return
    out = tmp_path_factory.getbasetemp()
    (out / "fault-matrix.json").write_text(json.dumps([asdict(row) for row in ROWS], indent=2))
    lines = ["| fault | detection | recovery | failed / sent | note |", "|---|---|---|---|---|"]
    for row in ROWS:
        lines.append(f"| {row.fault} | {_seconds(row.detection_s)} | {_seconds(row.recovery_s)} "
                     f"| {row.failed} / {row.sent} | {row.note} |")
    (out / "fault-matrix.md").write_text("\n".join(lines) + "\n")
    print(f"\nfault matrix ({out / 'fault-matrix.md'}):\n" + "\n".join(lines))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


# ---- the cases ---------------------------------------------------------------------------
def test_sigkill_prefill(borrowed: Handle, tmp_path: Path) -> None:
    """Only requests in flight when prefill dies may fail; decode prefills the rest meanwhile."""
    prefill = borrowed.processes()["prefill-0"]
    url = worker_url(borrowed, "prefill-0")
    with router_of_its_own(borrowed, tmp_path) as router, Load(router) as load:
        load.wait_for(8)
        kill_group(prefill["pid"], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(quiet(lambda: not member(router, url)["ready"]), "prefill out of rotation", 10)
        detection = time.monotonic() - killed
        health = httpx.get(f"{router}/health", timeout=5)
        assert health.status_code == 200, health.text
        assert (health.json()["status"], health.json().get("degraded")) == ("degraded", "prefill")
        load.wait_for(8)
        degraded = metric(router, "pdserve_router_degraded_total", {"missing_role": "prefill"})
        load.restarting()
        wait_for(ready_again(borrowed, "prefill-0", prefill["pid"]), "prefill-0 restarted",
              BACK_TIMEOUT_S, interval_s=0.5)
        wait_for(quiet(lambda: member(router, url)["ready"]), "prefill back in rotation", 10)
        recovery = time.monotonic() - killed
        load.restarted()
        load.wait_for(8)
    results = load.snapshot()
    late = [r for r in failed(results) if r.started >= killed]
    assert not late, f"requests started after the kill failed: {late}"
    assert degraded > 0, "no request was prefilled on decode while prefill was down"
    ROWS.append(Row("SIGKILL prefill (1P1D)", detection, recovery, len(failed(results)),
                    len(results), f"{degraded:g} prefilled on decode meanwhile"))


def test_sigkill_decode(borrowed: Handle, tmp_path: Path) -> None:
    """No request fails (issue 25, request migration): a stream in flight on decode goes on on
    prefill from its last token, a request dispatched to the dying decode runs again
    elsewhere; prefill serves whole requests meanwhile."""
    decode = borrowed.processes()["decode-0"]
    url = worker_url(borrowed, "decode-0")
    with router_of_its_own(borrowed, tmp_path) as router, Load(router) as load:
        load.wait_for(8)
        # One long stream besides the load, so that a stream is surely on decode when it dies.
        lines: list[str] = []
        with httpx.stream("POST", f"{router}/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True,
                "stream": True}) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if len(events(lines)) == 3:
                    kill_group(decode["pid"], signal.SIGKILL)
                    killed = time.monotonic()
        wait_for(quiet(lambda: not member(router, url)["ready"]), "decode out of rotation", 10)
        detection = time.monotonic() - killed
        load.wait_for(8)
        degraded = metric(router, "pdserve_router_degraded_total", {"missing_role": "decode"})
        migrated = metric(router, "pdserve_router_migrations_total", {"role": "decode"})
        load.restarting()
        wait_for(ready_again(borrowed, "decode-0", decode["pid"]), "decode-0 restarted",
              BACK_TIMEOUT_S, interval_s=0.5)
        # The console counts the restart (and the same model answers again: the load below).
        assert borrowed.processes()["decode-0"]["restarts"] == decode["restarts"] + 1
        wait_for(quiet(lambda: member(router, url)["ready"]), "decode back in rotation", 10)
        recovery = time.monotonic() - killed
        load.restarted()
        load.wait_for(8)
    assert events(lines)[-1] == "[DONE]", lines[-3:]
    assert not any('"error"' in e for e in events(lines)), lines[-3:]
    results = load.snapshot()
    assert not failed(results), f"requests failed through the decode kill: {failed(results)}"
    assert migrated >= 1, "the stream in flight was not migrated"
    assert degraded > 0, "no request was run whole on prefill while decode was down"
    ROWS.append(Row("SIGKILL decode (1P1D)", detection, recovery, len(failed(results)),
                    len(results), f"the stream in flight went on on prefill ({migrated:g} "
                                  f"migrated); {degraded:g} run whole on prefill meanwhile"))


def test_sigstop_a_worker_for_30_s(borrowed: Handle) -> None:
    """The deployment's own router, as the console starts it (default probes): a frozen decode
    is out of rotation within 4 s and back after SIGCONT."""
    decode = borrowed.processes()["decode-0"]
    url = worker_url(borrowed, "decode-0")
    router = borrowed.router
    with Load(router) as load:
        load.wait_for(8)
        kill_group(decode["pid"], signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_for(quiet(lambda: not member(router, url)["ready"]), "frozen decode out", 15)
            detection = time.monotonic() - stopped
            time.sleep(max(0.0, 30 - (time.monotonic() - stopped)))
        finally:
            kill_group(decode["pid"], signal.SIGCONT)
        resumed = time.monotonic()
        back = wait_for(quiet(lambda: member(router, url)["ready"]), "decode back", 15)
        load.wait_for(8)
    results = load.snapshot()
    # Two failed probes a second apart with a 0.6 s deadline take up to 2.6 s; a probe the
    # router's own loop was late for is inconclusive and waits for the next one (2-core CI).
    assert detection < 4, f"out of rotation only {detection:.1f} s after SIGSTOP"
    assert borrowed.processes()["decode-0"]["pid"] == decode["pid"]
    late = [r for r in failed(results) if r.started >= stopped + detection]
    assert not late, f"requests started once decode was out of rotation failed: {late}"
    ROWS.append(Row("SIGSTOP decode for 30 s", detection, resumed - stopped + back,
                    len(failed(results)), len(results),
                    f"back in rotation {back:.1f} s after SIGCONT"))


def test_sigkill_the_router(borrowed: Handle) -> None:
    """The supervisor restarts the router; clients meet refused connections only in the gap."""
    router = borrowed.processes()["router"]
    with Load(borrowed.router) as load:
        load.wait_for(8)
        kill_group(router["pid"], signal.SIGKILL)
        killed = time.monotonic()
        detection = wait_for(quiet(lambda: borrowed.processes()["router"]["state"] != "ready"),
                          "the console noticing the router's death", 30)
        wait_for(lambda: first_ok_started_after(load.snapshot(), killed) is not None,
              "a request answered by the new router", 60)
        gap = first_ok_started_after(load.snapshot(), killed)
        assert gap is not None
        wait_for(ready_again(borrowed, "router", router["pid"]), "router ready again", 60)
        load.wait_for(8)
    results = load.snapshot()
    gap_end = gap
    after_kill = [r for r in failed(results) if r.started >= killed]
    # A connection made in the moment between the SIGKILL and the kernel closing the dead
    # router's listening socket is reset instead of refused (seen once in CI, 0.18 s after the
    # kill); a client's kept-alive connection to the dead router is closed at its next request
    # before any answer ("Server disconnected without sending a response" within 5 ms, in the
    # next CI). No request reached a router either way.
    dying = [r for r in after_kill if r.started < gap_end and (
        (r.outcome.startswith("transport ReadError") and "reset by peer" in r.outcome
         and r.started - killed < 1.0)
        or (r.outcome == "transport RemoteProtocolError: Server disconnected without sending "
                         "a response." and r.ended - r.started < 0.1))]
    # The message names only the others: a truncated list of refusals hid the one that failed.
    other = [r for r in after_kill if r.outcome != "refused" and r not in dying]
    assert not other, other
    assert all(r.started < gap_end for r in after_kill), "refused after the router was back"
    ROWS.append(Row("SIGKILL router", detection, gap_end - killed, len(failed(results)),
                    len(results), f"gap {gap_end - killed:.1f} s of refused connections"))


def test_sigkill_the_console_web_process(borrowed: Handle) -> None:
    """Workers and router go on serving; `manage.py up` starts the web process again."""
    web = up_child("uvicorn")
    with Load(borrowed.router) as load:
        load.wait_for(8)
        web.kill()
        killed = time.monotonic()
        detection = wait_for(quiet(lambda: up_child("uvicorn").pid != web.pid),
                          "manage.py up starting the web process again", 30)
        wait_for(quiet(lambda: borrowed.deployment()["state"] == "ready"),
              "the console answering", 60, interval_s=0.2)
        recovery = time.monotonic() - killed
        load.wait_for(8)
    results = load.snapshot()
    assert not failed(results), failed(results)
    ROWS.append(Row("SIGKILL console web process", detection, recovery, 0, len(results),
                    "restarted by manage.py up; inference untouched"))


def test_sigkill_the_supervisor(borrowed: Handle) -> None:
    """Workers keep serving while no supervisor runs; the next one adopts every process (no
    duplicate, no orphan, no restart) and no request fails."""
    before = planned_pids(borrowed)
    ports = {slot: int(worker_url(borrowed, slot).rsplit(":", 1)[1])
             for slot in ("prefill-0", "decode-0")}
    ports["router"] = int(borrowed.router.rsplit(":", 1)[1])
    supervisor = up_child("manage.py supervise")
    # A supervisor says so in up's output once it has settled what the last one left (recover).
    up_log = borrowed.data_dir.parent / "up.log"
    running = up_log.read_text(errors="replace").count("supervisor: running")
    with Load(borrowed.router) as load:
        load.wait_for(8)
        supervisor.kill()
        killed = time.monotonic()
        detection = wait_for(quiet(lambda: up_child("manage.py supervise").pid != supervisor.pid),
                          "manage.py up starting a supervisor again", 30)
        # Until the next supervisor exists, nothing but the old processes serves.
        successor_started = time.monotonic() - (time.time() - up_child(
            "manage.py supervise").create_time())
        wait_for(lambda: up_log.read_text(errors="replace").count("supervisor: running") > running,
              "the next supervisor running", 120, interval_s=0.2)

        def clean() -> bool:
            processes = borrowed.processes()
            return all(p["state"] == "ready" and p["pid"] and psutil.pid_exists(p["pid"])
                       for p in processes.values()) and \
                httpx.get(f"{borrowed.router}/health", timeout=2).status_code == 200
        wait_for(quiet(clean), "every slot ready again", BACK_TIMEOUT_S, interval_s=0.5)
        recovery = time.monotonic() - killed
        load.wait_for(8)
    results = load.snapshot()
    after = planned_pids(borrowed)
    assert set(after) == set(before)
    for slot, port in ports.items():
        tree = {after[slot], *(c.pid for c in psutil.Process(after[slot]).children(recursive=True))}
        assert listeners(port) <= tree, f"{slot}: port {port} held by {listeners(port) - tree}"
    orphans = [pid for slot, pid in before.items() if pid != after[slot] and psutil.pid_exists(pid)]
    assert not orphans, f"old processes still alive: {orphans}"
    during_gap = [r for r in failed(results) if r.ended < successor_started]
    assert not during_gap, f"requests failed while no supervisor ran: {during_gap}"
    assert after == before, "the next supervisor started processes instead of adopting them"
    assert not failed(results), failed(results)
    ROWS.append(Row("SIGKILL supervisor", detection, recovery, 0, len(results),
                    "every process re-adopted by the next supervisor (same pids)"))


@contextmanager
def redis_server(port: int, logs: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of the test's own (the machine's on 6379 serves other tests)."""
    log = open(logs / f"redis-{port}.log", "ab")  # noqa: SIM115 - closed below
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _redis_keys(port) is not None, f"redis-server on {port}", 10)
        yield server
    finally:
        server.kill()
        server.wait()
        log.close()


def _redis_keys(port: int) -> int | None:
    """How many keys the Redis on ``port`` holds; None when it does not answer."""
    try:
        done = subprocess.run(["redis-cli", "-p", str(port), "dbsize"], capture_output=True,
                              text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return None
    answer = done.stdout.strip()
    return int(answer) if done.returncode == 0 and answer.isdigit() else None


def test_redis_down_while_redis_url_is_set(borrowed: Handle, tmp_path: Path) -> None:
    """A router sharing per-key limits in Redis goes on serving when Redis dies."""
    key = new_key()
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"version": "fault-matrix", "require_key": True, "keys": [{
        "id": 1, "prefix": public_prefix(key), "hash": key_hash(key), "state": "active",
        "limits": {"requests_per_minute": 100000, "prompt_tokens_per_minute": None,
                   "generated_tokens_per_minute": 10000000, "max_concurrency": 16}}]}))
    port = free_port()
    env = {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    with redis_server(port, tmp_path) as redis, \
            router_of_its_own(borrowed, tmp_path, env, ("--keys-file", str(keys_file))) as router, \
            Load(router, headers={"Authorization": f"Bearer {key}"}) as load:
        load.wait_for(8)
        assert (_redis_keys(port) or 0) > 0, "the router does not count in Redis"
        redis.kill()
        killed = time.monotonic()
        detection = wait_for(quiet(lambda: metric(
            router, "pdserve_router_rate_limit_store_errors_total") > 0),
            "the router noticing Redis is gone", 15, interval_s=0.1)
        load.wait_for(12)
        with redis_server(port, tmp_path):
            restarted = time.monotonic()
            back = wait_for(lambda: (_redis_keys(port) or 0) > 0, "the router counting in Redis again",
                         15, interval_s=0.1)
            load.wait_for(8)
    results = load.snapshot()
    assert not failed(results), failed(results)
    assert any(r.started > killed and r.ended < restarted for r in results)
    ROWS.append(Row("Redis (REDIS_URL) killed", detection, None, 0, len(results),
                    f"served on in-memory limits; counted in Redis again {back:.1f} s after it "
                    f"was back"))


def _unmount(path: Path, timeout_s: float = 10) -> None:
    """Unmount ``path``, trying again while it is busy: the prefill worker may hold a file open
    there in the middle of a save (seen once: "target is busy" ended the test mid-load)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = subprocess.run(["umount", str(path)], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, f"umount {path}: {done.stderr.strip()}"
        time.sleep(0.1)


def test_the_kv_directory_full(borrowed: Handle, tmp_path: Path) -> None:
    """Shared-storage KV that cannot be saved: decode computes the prompt itself, no request
    fails, and the prefill worker's log names the cause."""
    # The live revision's own directory (console/control/worker_specs.kv_storage_path).
    kv_dir = borrowed.data_dir / "kv" / f"{NAME}@r{borrowed.deployment()['revision']['number']}"
    prefill_log = borrowed.log("prefill-0")
    pids = planned_pids(borrowed)
    logged_before = prefill_log.read_text(errors="replace").count("KV not saved")
    # A tmpfs of 1 MiB over the directory, filled to the last byte: every save fails with
    # ENOSPC (chmod would not stop root).
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(kv_dir)], check=True)
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={kv_dir / 'filler'}", "bs=64k"],
                       capture_output=True, check=False)
        with router_of_its_own(borrowed, tmp_path) as router, \
                Load(router, unique_prompts=True) as load:
            filled = time.monotonic()
            detection = wait_for(lambda: prefill_log.read_text(errors="replace").count(
                "KV not saved") > logged_before, "a log line about the failed save", 30)
            load.wait_for(12)
            _unmount(kv_dir)
            freed = time.monotonic()
            back = wait_for(lambda: any((kv_dir / entry).joinpath("complete").is_file()
                                     for entry in os.listdir(kv_dir)),
                         "a KV folder saved again", 30, interval_s=0.1)
            load.wait_for(8)
    finally:
        subprocess.run(["umount", str(kv_dir)], capture_output=True, check=False)
    results = load.snapshot()
    assert not failed(results), failed(results)
    assert planned_pids(borrowed) == pids, "a worker died"
    assert any("KV not saved" in line and "No space left on device" in line
               for line in prefill_log.read_text(errors="replace").splitlines())
    # The troubleshooting view names the symptom (2) and the full directory as its cause.
    kv = wait_for_symptom(borrowed, "kv-transfer-timeout", "storage", ("present", "suspected"))
    assert kv["causes"][0]["id"] == "storage", kv["causes"]
    ROWS.append(Row("shared-storage KV directory full", detection, freed - filled + back,
                    0, len(results), "decode computed the prompts itself; saved again "
                                     f"{back:.1f} s after space came back"))
