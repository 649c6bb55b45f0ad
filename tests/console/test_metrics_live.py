"""Metric snapshots reach the dashboard's websocket: through the hub, or straight from Redis."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.asgi import application
from console.deployments.models import Deployment
from console.live.collector import MetricsCollector, ScrapeTarget
from console.live.models import MetricSample
from console.supervisor.models import ManagedProcess

ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(user: User) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def connect(deployment: Deployment, owner: User) -> WebsocketCommunicator:
    cookie = await sync_to_async(session_cookie)(owner)
    communicator = WebsocketCommunicator(application, f"/ws/deployments/{deployment.pk}/live/",
                                         headers=[ORIGIN, cookie])
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    return communicator


async def receive_metrics(communicator: WebsocketCommunicator, timeout: float = 10.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        message = await communicator.receive_json_from(timeout=max(remaining, 0.01))
        if message["type"] == "metrics":
            return message


def store_sample(deployment: Deployment, marker: int) -> MetricSample:
    return MetricSample.objects.create(deployment=deployment, resolution="1s", created=timezone.now(),
                                       data={"processes": {"router": {"role": "router", "rps": marker}}})


@pytest.mark.django_db(transaction=True)
async def test_anonymous_and_unknown_dashboards_are_refused(deployment: Deployment,
                                                            owner: User) -> None:
    anonymous = WebsocketCommunicator(application, f"/ws/deployments/{deployment.pk}/live/",
                                      headers=[ORIGIN])
    assert await anonymous.connect(timeout=5) == (False, 4401)
    cookie = await sync_to_async(session_cookie)(owner)
    missing = WebsocketCommunicator(application, "/ws/deployments/999999/live/", headers=[ORIGIN, cookie])
    assert await missing.connect(timeout=5) == (False, 4404)


@pytest.mark.django_db(transaction=True)
async def test_a_stored_sample_reaches_the_dashboard_through_the_in_memory_hub(
        deployment: Deployment, owner: User) -> None:
    communicator = await connect(deployment, owner)
    try:
        # The hub starts from "now" once it has read the newest id; store until one is carried.
        stored: dict[int, MetricSample] = {}
        for marker in range(1, 40):
            stored[marker] = await sync_to_async(store_sample)(deployment, marker)
            if not await communicator.receive_nothing(timeout=0.25):
                break
        message = await receive_metrics(communicator)
        assert message["deployment"] == deployment.pk
        carried = message["data"]["processes"]["router"]["rps"]
        assert message["data"] == {"processes": {"router": {"role": "router", "rps": carried}}}
        assert message["at"] == stored[carried].created.isoformat()
    finally:
        await communicator.disconnect()


@pytest.fixture
def redis_layer(settings: Any) -> Iterator[None]:
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [settings.REDIS_URL],
                   "prefix": f"pdserve-test-metrics-{os.getpid()}-{timezone.now().timestamp()}"},
    }}
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
async def test_with_redis_the_collector_broadcasts_right_after_storing(
        redis_layer: None, deployment: Deployment, owner: User) -> None:
    # Nothing listens on this port: the snapshot says the process is down, and still goes out.
    process = await sync_to_async(ManagedProcess.objects.create)(
        deployment=deployment, slot="decode-0", role="decode", port=9, log_path="/nonexistent.log",
        state=ManagedProcess.State.STARTING)
    collector = MetricsCollector(lambda: [ScrapeTarget(process.pk, os.getpid())])
    communicator = await connect(deployment, owner)
    try:
        [sample] = await sync_to_async(collector.collect_once)()
        message = await receive_metrics(communicator)
        assert message["at"] == sample.created.isoformat()
        entry = message["data"]["processes"]["decode-0"]
        assert (entry["role"], entry["up"]) == ("decode", 0)
        assert entry["rss"] > 0
    finally:
        await communicator.disconnect()
        collector.http.close()
