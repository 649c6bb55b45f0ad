"""Usage metering: every request served after its body was parsed is counted per (UTC day, key
id) in the ledger, with and without a key, streamed or not, answered or refused or failed; the
counts survive a restart through --usage-file, a write that fails keeps them, and the console
reads them from GET /admin/usage behind the admin token."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from inference.router.config import build_parser, config_from_args
from inference.router.keys import key_hash, new_key, public_prefix
from inference.router.server import main
from inference.router.usage import UsageLedger
from tests.unit.conftest import MODEL, RunningRouter, StubVLLM, wait_until

StartRouter = Callable[..., Awaitable[RunningRouter]]
MakeStub = Callable[[str], Awaitable[StubVLLM]]

ADMIN = "admin-token"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
PROMPT = "hello world the quick brown fox"
COMPLETION = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
WITH_USAGE = {"stream": True, "stream_options": {"include_usage": True}}
COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens")


@dataclass
class Tally:
    """What the clients saw, per key id: the ledger must say the same."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def keys_file(tmp_path: Path, *entries: tuple[str, int, dict[str, int]],
              require_key: bool = False) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"version": "v1", "require_key": require_key, "keys": [
        {"id": key_id, "prefix": public_prefix(key), "hash": key_hash(key), "limits": limits}
        for key, key_id, limits in entries]}))
    return str(path)


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def send(client: TestClient, tally: dict[str, Tally], key_id: str, key: str | None,
               path: str, body: dict[str, Any]) -> int:
    """Send one request and count it as the client sees it: an error status or error event,
    and the tokens of the answer's usage."""
    response = await client.post(path, json=body, headers=bearer(key))
    text = await response.text()
    seen = tally.setdefault(key_id, Tally())
    seen.requests += 1
    if body.get("stream") and response.status == 200:
        events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
        failed = any("error" in event for event in events)
        usage = next((event["usage"] for event in events if event.get("usage")), None)
    else:
        failed = response.status >= 400
        usage = json.loads(text).get("usage") if not failed else None
    seen.errors += failed
    if usage is not None:
        seen.prompt_tokens += usage["prompt_tokens"]
        seen.completion_tokens += usage["completion_tokens"]
    return response.status


async def usage_rows(client: TestClient, query: str = "") -> list[dict[str, Any]]:
    response = await client.get(f"/admin/usage{query}", headers=ADMIN_AUTH)
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert answer["version"] == 1
    return answer["rows"]


def by_key(rows: list[dict[str, Any]]) -> dict[str, Tally]:
    totals: dict[str, Tally] = {}
    for row in rows:
        seen = totals.setdefault(row["key"], Tally())
        for name in COUNTERS:
            setattr(seen, name, getattr(seen, name) + row[name])
    return totals


def stored(path: Path) -> list[tuple[Any, ...]]:
    """The ledger file's rows as another process (the console) would read them."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT day, key, requests, errors, prompt_tokens, completion_tokens "
                          "FROM usage ORDER BY day, key").fetchall()


def today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


# ---- what is counted -----------------------------------------------------------------------------

async def test_the_ledger_counts_what_the_clients_saw(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("worker")
    worker.with_usage = True
    member, tight = new_key(), new_key()
    running = await start_router(
        colocated=(worker.url,), admin_token=ADMIN,
        keys_file=keys_file(tmp_path, (member, 7, {}), (tight, 8, {"prompt_tokens_per_minute": 3})))
    client, tally = running.client, {}

    assert await send(client, tally, "7", member, "/v1/completions", COMPLETION) == 200
    assert await send(client, tally, "7", member, "/v1/chat/completions",
                      {**CHAT, **WITH_USAGE}) == 200
    assert await send(client, tally, "7", member, "/v1/completions",
                      {**COMPLETION, **WITH_USAGE}) == 200
    # Refused after its body was parsed: its prompt is over the key's whole minute.
    assert await send(client, tally, "8", tight, "/v1/completions", COMPLETION) == 429
    # An open deployment: no key, or one it does not know, is served and metered under "".
    assert await send(client, tally, "", None, "/v1/chat/completions", CHAT) == 200
    assert await send(client, tally, "", "EMPTY", "/v1/completions",
                      {**COMPLETION, **WITH_USAGE}) == 200
    worker.fail_with = (500, {"error": {"message": "boom", "type": "InternalServerError"}})
    assert await send(client, tally, "", None, "/v1/completions", COMPLETION) == 500
    assert await send(client, tally, "7", member, "/v1/chat/completions", CHAT) == 500

    rows = await usage_rows(client)
    assert [(row["day"], row["key"]) for row in rows] == [(today(), ""), (today(), "7"),
                                                         (today(), "8")]
    assert by_key(rows) == tally
    assert tally["7"] == Tally(requests=4, errors=1, prompt_tokens=tally["7"].prompt_tokens,
                               completion_tokens=1 + 4 + 4)
    assert tally["7"].prompt_tokens > 0 and tally[""].prompt_tokens > 0
    assert tally["8"] == Tally(requests=1, errors=1)
    assert all(row["latency_ms_sum"] > 0 for row in rows)


async def test_a_stream_cut_off_mid_way_a_worker_error_event_and_a_client_that_leaves_are_errors(
        start_router: StartRouter, make_stub: MakeStub) -> None:
    worker = await make_stub("worker")
    running = await start_router(colocated=(worker.url,), admin_token=ADMIN)
    client = running.client

    # The worker's own error event at the end of a stream that began: a 200 that failed
    # (first: the cut below takes the worker out of rotation).
    worker.error_event = True
    response = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert response.status == 200 and '"error"' in await response.text()
    worker.error_event = False

    # No other worker to continue on: the client gets an error event after two chunks.
    worker.die_after_chunks = 2
    response = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert response.status == 200 and '"error"' in await response.text()
    worker.die_after_chunks = None

    worker.stream_gate = asyncio.Event()
    response = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
    await response.content.readany()  # the first chunk, then the client goes
    response.close()
    worker.stream_gate.set()

    async def metered() -> int:
        return sum(row["requests"] for row in await usage_rows(client))

    deadline = time.monotonic() + 5
    while await metered() < 3:
        assert time.monotonic() < deadline, "the client that left was never metered"
        await asyncio.sleep(0.02)
    [row] = await usage_rows(client)
    assert (row["key"], row["requests"], row["errors"]) == ("", 3, 3)
    assert await running.metric("pdserve_router_usage_requests_total",
                                {"key": "", "outcome": "error"}) == 3


async def test_auth_failures_are_not_metered_and_the_metrics_follow_the_keys(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("worker")
    worker.with_usage = True
    member = new_key()
    running = await start_router(colocated=(worker.url,), admin_token=ADMIN,
                                 keys_file=keys_file(tmp_path, (member, 7, {}), require_key=True))
    client, tally = running.client, {}
    assert await send(client, tally, "7", member, "/v1/completions", COMPLETION) == 200
    # Refused before its body was parsed: not metered either.
    assert (await client.post("/v1/completions", data=b"{not json",
                              headers=bearer(member))).status == 400
    assert (await client.post("/v1/completions", json=COMPLETION)).status == 401
    assert (await client.post("/v1/completions", json=COMPLETION,
                              headers=bearer(new_key()))).status == 401

    [row] = await usage_rows(client)
    assert (row["key"], row["requests"], row["errors"]) == ("7", 1, 0)
    label = f"pds_{public_prefix(member)}"
    assert await running.metric("pdserve_router_usage_requests_total",
                                {"key": label, "outcome": "ok"}) == 1
    assert await running.metric("pdserve_router_usage_requests_total",
                                {"key": label, "outcome": "error"}) == 0
    assert await running.metric("pdserve_router_usage_tokens_total",
                                {"key": label, "kind": "prompt"}) == tally["7"].prompt_tokens > 0
    assert await running.metric("pdserve_router_usage_tokens_total",
                                {"key": label, "kind": "completion"}) == 1
    assert await running.metric("pdserve_router_usage_requests_total",
                                {"key": "", "outcome": "error"}) == 0


# ---- durable -------------------------------------------------------------------------------------

async def test_the_counts_survive_a_restart_and_go_on_adding(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    worker = await make_stub("worker")
    worker.with_usage = True
    member = new_key()
    path = tmp_path / "ledger" / "usage.sqlite3"
    settings = {"colocated": (worker.url,), "admin_token": ADMIN, "usage_file": str(path),
                "keys_file": keys_file(tmp_path, (member, 7, {}))}
    first = await start_router(**settings)
    tally: dict[str, Tally] = {}
    for key_id, key in (("7", member), ("7", member), ("", None)):
        await send(first.client, tally, key_id, key, "/v1/completions", COMPLETION)
    before = await usage_rows(first.client)
    assert by_key(before) == tally
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    await first.client.close()  # the app's cleanup, as on SIGTERM
    assert [row[1:] for row in stored(path)] == [
        (key_id, t.requests, t.errors, t.prompt_tokens, t.completion_tokens)
        for key_id, t in sorted(tally.items())]

    second = await start_router(**settings)
    assert await usage_rows(second.client) == before
    await send(second.client, tally, "7", member, "/v1/completions", COMPLETION)
    assert by_key(await usage_rows(second.client)) == tally
    assert tally["7"].requests == 3


async def test_deltas_reach_the_file_within_the_flush_interval(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    # What a SIGKILL may lose: no more than the last interval.
    worker = await make_stub("worker")
    path = tmp_path / "usage.sqlite3"
    running = await start_router(colocated=(worker.url,), usage_file=str(path))
    assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200
    await wait_until(lambda: len(stored(path)) == 1, timeout_s=2.0)
    assert stored(path)[0][:4] == (today(), "", 1, 0)


async def test_a_write_that_fails_keeps_the_deltas_until_one_succeeds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite3"
    ledger = UsageLedger(str(path), busy_timeout_s=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    caplog.set_level(logging.INFO, "pdserve.router.usage")

    ledger.record("7", False, 10, 4, 12.5)
    ledger.record("7", True, 0, 0, 1.5)
    assert await ledger.flush() is False
    ledger.record("", False, 3, 2, 2.0)
    assert await ledger.flush() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot write" in warnings[0].getMessage()
    # Still readable meanwhile, the unwritten deltas included.
    assert [(r["key"], r["requests"], r["errors"], r["prompt_tokens"], r["completion_tokens"],
             r["latency_ms_sum"]) for r in await ledger.rows()] == [
        ("", 1, 0, 3, 2, 2.0), ("7", 2, 1, 10, 4, 14.0)]

    blocker.execute("ROLLBACK")
    assert await ledger.flush() is True
    assert "written again after 2 failed flushes" in caplog.text
    assert [row[1:] for row in stored(path)] == [("", 1, 0, 3, 2), ("7", 2, 1, 10, 4)]
    # Written once, not again.
    assert await ledger.flush() is True
    await ledger.close()
    blocker.close()
    assert [row[1:] for row in stored(path)] == [("", 1, 0, 3, 2), ("7", 2, 1, 10, 4)]


async def test_a_read_or_a_cancel_during_a_write_counts_each_request_once(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    ledger = UsageLedger(str(path), busy_timeout_s=2.0)
    ledger.record("7", False, 1, 1, 1.0)
    assert await ledger.flush() is True
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    ledger.record("7", False, 1, 1, 1.0)
    flushing = asyncio.create_task(ledger.flush())
    await asyncio.sleep(0.05)  # the write waits for the file
    reading = asyncio.create_task(ledger.rows())
    ledger.record("7", True, 0, 0, 1.0)
    await asyncio.sleep(0.05)
    blocker.execute("ROLLBACK")
    assert await flushing is True
    [row] = await reading
    assert (row["requests"], row["errors"], row["prompt_tokens"]) == (3, 1, 2)

    # A flush cancelled while its thread writes: the write still lands, once.
    blocker.execute("BEGIN IMMEDIATE")
    cancelled = asyncio.create_task(ledger.flush())
    await asyncio.sleep(0.05)
    cancelled.cancel()
    await asyncio.sleep(0.05)
    blocker.execute("ROLLBACK")
    blocker.close()
    await ledger.close()
    assert stored(path) == [(today(), "7", 3, 1, 2, 2)]


async def test_shutdown_writes_what_the_last_interval_left(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    ledger = UsageLedger(str(path), flush_interval_s=60)
    ledger.start()
    ledger.record("7", False, 5, 5, 1.0)
    assert stored(path) == []
    await ledger.close()
    assert stored(path) == [(today(), "7", 1, 0, 5, 5)]


async def test_a_request_counts_on_the_utc_day_it_ended(tmp_path: Path) -> None:
    now = [1_796_515_199.5]  # 2026-12-05 23:59:59.5 UTC
    ledger = UsageLedger(clock=lambda: now[0])
    ledger.record("7", False, 1, 1, 1.0)
    now[0] += 1  # 2026-12-06 00:00:00.5
    ledger.record("7", False, 1, 1, 1.0)
    assert [(r["day"], r["requests"]) for r in await ledger.rows()] == [
        ("2026-12-05", 1), ("2026-12-06", 1)]
    assert [r["day"] for r in await ledger.rows("2026-12-06")] == ["2026-12-06"]
    await ledger.close()


# ---- the admin endpoint --------------------------------------------------------------------------

async def test_since_keeps_the_days_from_that_one_on(
        start_router: StartRouter, make_stub: MakeStub, tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    UsageLedger(str(path))  # makes the file, as a router that ran before would have
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?)", [
            ("2026-11-30", "7", 5, 1, 50, 20, 100.0), ("2026-12-01", "", 2, 0, 8, 8, 30.0),
            ("2026-12-01", "7", 1, 0, 4, 4, 10.0)])
    worker = await make_stub("worker")
    running = await start_router(colocated=(worker.url,), admin_token=ADMIN, usage_file=str(path))
    assert (await running.client.post("/v1/completions", json=COMPLETION)).status == 200

    every = await usage_rows(running.client)
    assert [(r["day"], r["key"]) for r in every] == [
        ("2026-11-30", "7"), ("2026-12-01", ""), ("2026-12-01", "7"), (today(), "")]
    assert every[0] == {"day": "2026-11-30", "key": "7", "requests": 5, "errors": 1,
                        "prompt_tokens": 50, "completion_tokens": 20, "latency_ms_sum": 100.0}
    assert await usage_rows(running.client, "?since=2026-12-01") == every[1:]
    assert await usage_rows(running.client, f"?since={today()}") == every[3:]
    assert await usage_rows(running.client, "?since=2999-01-01") == []


@pytest.mark.parametrize("since", ["yesterday", "2026-12-4", "2026-02-30", "2026-12-04T00:00",
                                   ""])
async def test_a_malformed_since_is_400_naming_it(start_router: StartRouter, make_stub: MakeStub,
                                                  since: str) -> None:
    worker = await make_stub("worker")
    running = await start_router(colocated=(worker.url,), admin_token=ADMIN)
    response = await running.client.get("/admin/usage", params={"since": since},
                                        headers=ADMIN_AUTH)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == "since" and "since" in error["message"]


async def test_the_usage_is_behind_the_admin_token(start_router: StartRouter,
                                                   make_stub: MakeStub) -> None:
    worker = await make_stub("worker")
    running = await start_router(colocated=(worker.url,), admin_token=ADMIN,
                                 api_key="inference-key")
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": "Bearer inference-key"}):
        response = await running.client.get("/admin/usage", headers=headers)
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "invalid_admin_token"
    closed = await start_router(colocated=(worker.url,))
    response = await closed.client.get("/admin/usage", headers=ADMIN_AUTH)
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "admin_disabled"


# ---- the flag ------------------------------------------------------------------------------------

def test_help_names_the_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "inference.router", "--help"],
                            capture_output=True, text=True, check=True, timeout=60)
    assert "--usage-file" in result.stdout


REQUIRED = ["--served-model-name", MODEL, "--tokenizer", "/m", "--max-model-len", "128",
            "--colocated", "http://a:1"]


def test_the_flag_makes_the_file_and_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "new" / "dir" / "usage.sqlite3"
    config = config_from_args(build_parser().parse_args([*REQUIRED, "--usage-file", str(path)]))
    assert config.usage_file == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stored(path) == []


def test_a_path_it_cannot_use_stops_the_router_naming_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    not_a_ledger = tmp_path / "notes.txt"
    not_a_ledger.write_text("this is not a database, just some text " * 100)
    for path in (a_file / "usage.sqlite3", not_a_ledger, tmp_path):
        with pytest.raises(ValueError, match="--usage-file"):
            config_from_args(build_parser().parse_args([*REQUIRED, "--usage-file", str(path)]))
    with pytest.raises(SystemExit) as exited:
        main([*REQUIRED, "--usage-file", str(a_file / "usage.sqlite3")])
    assert exited.value.code == 2
    assert "--usage-file" in capsys.readouterr().err
