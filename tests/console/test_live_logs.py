"""Logs: stored first with sequence numbers, broadcast to websockets, backfilled over REST."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.asgi import application
from console.control.daemon import Supervisor
from console.deployments.models import Deployment
from console.live.broadcast import MAX_LINES_PER_MESSAGE, log_messages
from console.live.logstore import LogStore
from console.live.models import LogLine
from console.supervisor.capture import MAX_LINE_CHARS, CapturedLine, clean_line
from console.supervisor.models import ManagedProcess

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture
def process(deployment: Deployment) -> ManagedProcess:
    return ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode",
                                         port=8200, state=ManagedProcess.State.READY,
                                         log_path="/nonexistent.log")


def captured(process: ManagedProcess, *texts: str) -> list[CapturedLine]:
    return [CapturedLine(process.pk, text, timezone.now()) for text in texts]


# ---- storing ------------------------------------------------------------------------------


def test_sequence_numbers_are_per_process_and_survive_a_new_store(process: ManagedProcess,
                                                                   deployment: Deployment) -> None:
    other = ManagedProcess.objects.create(deployment=deployment, slot="prefill-0", role="prefill",
                                          port=8100, log_path="/nonexistent.log")
    store = LogStore()
    store.write(captured(process, "a", "b") + captured(other, "x") + captured(process, "c"))
    # A restarted supervisor continues where the last one stopped.
    LogStore().write(captured(process, "d"))
    assert list(LogLine.objects.filter(process=process).values_list("seq", "text")) == [
        (1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert list(LogLine.objects.filter(process=other).values_list("seq", "text")) == [(1, "x")]


def test_prune_keeps_the_newest_lines(process: ManagedProcess) -> None:
    store = LogStore(retention_lines=5)
    store.write(captured(process, *(f"line {i}" for i in range(1, 13))))
    assert store.prune() == 7
    assert list(LogLine.objects.filter(process=process).values_list("seq", flat=True)) == [
        8, 9, 10, 11, 12]


@pytest.mark.parametrize(("raw", "expected"), [
    (b"plain line\n", "plain line"),
    (b"windows line\r\n", "windows line"),
    (b"progress 10%\rprogress 50%\rprogress 100%\n", "progress 100%"),
    (b"bad \xff byte\n", "bad \ufffd byte"),
])
def test_clean_line(raw: bytes, expected: str) -> None:
    assert clean_line(raw) == expected


def test_clean_line_cuts_runaway_lines() -> None:
    assert len(clean_line(b"x" * (MAX_LINE_CHARS * 3) + b"\n")) == MAX_LINE_CHARS


def test_a_flood_broadcasts_only_the_newest_lines(process: ManagedProcess) -> None:
    rows = LogStore().write(captured(process, *(str(i) for i in range(500))))
    [(group, payload)] = log_messages(rows)
    assert group == f"process-{process.pk}"
    seqs = [line[0] for line in payload["lines"]]
    assert seqs == list(range(501 - MAX_LINES_PER_MESSAGE, 501))
    # ...and every one of the 500 is stored for the browser's backfill.
    assert LogLine.objects.filter(process=process).count() == 500


# ---- REST ---------------------------------------------------------------------------------


@pytest.fixture
def api(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def test_backfill_pages_by_sequence_number(api: Client, process: ManagedProcess) -> None:
    LogStore().write(captured(process, *(f"line {i}" for i in range(1, 8))))
    first = api.get(f"/api/v1/processes/{process.pk}/logs?after=2&limit=3").json()
    assert [line["seq"] for line in first["lines"]] == [3, 4, 5]
    assert first["has_more"] is True and first["next_after"] == 5
    rest = api.get(f"/api/v1/processes/{process.pk}/logs/?after=5&limit=3").json()
    assert [line["text"] for line in rest["lines"]] == ["line 6", "line 7"]
    assert rest["has_more"] is False
    tail = api.get(f"/api/v1/processes/{process.pk}/logs?tail=2").json()
    assert [line["seq"] for line in tail["lines"]] == [6, 7]


def test_search_and_download(api: Client, process: ManagedProcess) -> None:
    LogStore().write(captured(process, "INFO started", "ERROR KV load failure", "INFO done"))
    found = api.get(f"/api/v1/processes/{process.pk}/logs?q=kv load").json()
    assert [line["text"] for line in found["lines"]] == ["ERROR KV load failure"]
    download = api.get(f"/api/v1/processes/{process.pk}/logs/download")
    assert download.status_code == 200
    assert download["Content-Disposition"] == 'attachment; filename="smollm2-1p1d-decode-0.log"'
    body = b"".join(download.streaming_content).decode()
    assert [line.split(" ", 1)[1] for line in body.splitlines()] == [
        "INFO started", "ERROR KV load failure", "INFO done"]


@pytest.mark.parametrize(("query", "field"), [("after=-1", "after"), ("after=x", "after"),
                                             ("limit=0", "limit"), ("limit=99999", "limit")])
def test_bad_parameters_name_the_field(api: Client, process: ManagedProcess, query: str,
                                       field: str) -> None:
    response = api.get(f"/api/v1/processes/{process.pk}/logs?{query}")
    assert response.status_code == 400
    assert field in response.json()


def test_logs_need_a_login_and_an_existing_process(process: ManagedProcess, api: Client) -> None:
    assert Client().get(f"/api/v1/processes/{process.pk}/logs").status_code in (401, 403)
    assert Client().get(f"/processes/{process.pk}/log/").status_code == 302
    assert api.get("/api/v1/processes/999999/logs").status_code == 404
    page = api.get(f"/processes/{process.pk}/log/")
    assert page.status_code == 200
    assert f'data-ws="/ws/processes/{process.pk}/logs/"' in page.content.decode()


# ---- websockets ---------------------------------------------------------------------------


def _session_cookie(user: User) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def _connect(path: str, headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    return communicator


async def _receive_log(communicator: WebsocketCommunicator, seq: int) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        message = await communicator.receive_json_from(timeout=max(remaining, 0.01))
        if message["type"] == "log" and message["lines"][-1][0] >= seq:
            return message


@pytest.mark.django_db(transaction=True)
async def test_anonymous_and_unknown_sockets_are_refused(process: ManagedProcess,
                                                         owner: User) -> None:
    anonymous = WebsocketCommunicator(application, f"/ws/processes/{process.pk}/logs/",
                                      headers=[ORIGIN])
    assert await anonymous.connect(timeout=5) == (False, 4401)
    cookie = await sync_to_async(_session_cookie)(owner)
    missing = WebsocketCommunicator(application, "/ws/processes/999999/logs/",
                                    headers=[ORIGIN, cookie])
    assert await missing.connect(timeout=5) == (False, 4404)
    foreign = WebsocketCommunicator(application, f"/ws/processes/{process.pk}/logs/",
                                    headers=[(b"origin", b"http://evil.example"), cookie])
    connected, _ = await foreign.connect(timeout=5)
    assert not connected


@pytest.mark.django_db(transaction=True)
async def test_stored_lines_reach_the_socket_through_the_in_memory_hub(
        process: ManagedProcess, owner: User) -> None:
    cookie = await sync_to_async(_session_cookie)(owner)
    communicator = await _connect(f"/ws/processes/{process.pk}/logs/", [ORIGIN, cookie])
    try:
        await asyncio.sleep(0.3)  # the hub starts from "now"
        await sync_to_async(LogStore().write)(captured(process, "hello", "world"))
        message = await _receive_log(communicator, 2)
        assert message["lines"][-2][0::2] == [1, "hello"]
        assert message["lines"][-1][0::2] == [2, "world"]
    finally:
        await communicator.disconnect()


@pytest.fixture
def redis_layer(settings: Any) -> Iterator[None]:
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": f"pdserve-test-{timezone.now().timestamp()}"},
    }}
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
async def test_with_redis_the_supervisor_broadcasts_right_after_storing(
        redis_layer: None, process: ManagedProcess, owner: User, tmp_path: Any) -> None:
    cookie = await sync_to_async(_session_cookie)(owner)
    communicator = await _connect(f"/ws/processes/{process.pk}/logs/", [ORIGIN, cookie])
    try:
        supervisor = Supervisor(log_dir=tmp_path)
        for line in captured(process, "from the supervisor"):
            supervisor.captured.put(line)
        assert await sync_to_async(supervisor.flush_logs)()
        message = await _receive_log(communicator, 1)
        assert message["lines"] == [[1, message["lines"][0][1], "from the supervisor"]]
    finally:
        await communicator.disconnect()


def test_old_lines_keep_their_time(process: ManagedProcess) -> None:
    past = timezone.now() - timedelta(minutes=5)
    [row] = LogStore().write([CapturedLine(process.pk, "old", past)])
    assert LogLine.objects.get(pk=row.pk).created == past
