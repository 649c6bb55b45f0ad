"""The gateway page's traffic table and its API (GET /api/v1/gateway/traffic/): each visible
deployment's requests and refusals per second from the collector's latest snapshot, and its
queue read live from the gateway's admin API (a stand-in here), or why it could not be read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from console.accounts.models import Team
from console.deployments.models import Deployment
from console.gateway import gateway_process
from console.live.models import MetricSample
from console.supervisor.models import ManagedProcess
from tests.console.passwords import OWNER_PASSWORD
from tests.json_handler import JsonHandler

URL = "/api/v1/gateway/traffic/"


class _QueuesHandler(JsonHandler):
    server: GatewayStub

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.authorizations.append(self.headers.get("Authorization", ""))
        if self.path != "/admin/queues":
            self.send_json(404, {})
            return
        self.send_bytes(200, json.dumps(self.server.queues).encode())


class GatewayStub(ThreadingHTTPServer):
    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _QueuesHandler)
        self.queues: dict[str, Any] = {"deployments": []}
        self.authorizations: list[str] = []


@pytest.fixture
def gateway_stub(settings: Any) -> Iterator[GatewayStub]:
    stub = GatewayStub()
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    settings.PDSERVE_GATEWAY_PORT = stub.server_address[1]
    yield stub
    stub.shutdown()
    stub.server_close()


def test_traffic_joins_the_snapshot_s_rates_and_the_live_queue(
        api: APIClient, deployment: Deployment, gateway_stub: GatewayStub) -> None:
    MetricSample.objects.create(deployment=deployment, resolution=MetricSample.Resolution.SECOND,
                                created=timezone.now(), data={"processes": {"router": {
                                    "role": "router", "gateway_rps": 12.5, "gateway_shed_ps": 3.0,
                                    "gateway_waiting": 4}}})
    gateway_stub.queues = {"deployments": [
        {"deployment": deployment.name, "in_flight": 8, "limit": 8,
         "waiting": [{"band": "high", "flow": "web", "requests": 1},
                     {"band": "low", "flow": "batch", "requests": 3}],
         "in_flight_by_flow": [{"flow": "batch", "requests": 5},
                               {"flow": "web", "requests": 3}]},
        # A deployment the caller may not see is never shown.
        {"deployment": "someone-else", "in_flight": 1, "limit": 2, "waiting": [],
         "in_flight_by_flow": [{"flow": "x", "requests": 1}]}]}
    body = api.get(URL).json()
    assert body == {"gateway": "running", "deployments": [{
        "deployment": deployment.name, "model": deployment.served_model_name, "rps": 12.5,
        "shed_ps": 3.0, "in_flight": 8, "limit": 8,
        "waiting": [{"band": "high", "flow": "web", "requests": 1},
                    {"band": "low", "flow": "batch", "requests": 3}],
        "in_flight_by_flow": [{"flow": "batch", "requests": 5},
                              {"flow": "web", "requests": 3}]}]}
    assert gateway_stub.authorizations == [f"Bearer {gateway_process.admin_token()}"]


def test_an_unreachable_or_off_gateway_is_said_and_the_rest_still_shown(
        api: APIClient, deployment: Deployment, gateway_stub: GatewayStub, settings: Any) -> None:
    gateway_stub.queues = {"unexpected": True}
    body = api.get(URL).json()
    assert body["gateway"].startswith("unreachable: GET /admin/queues: not a queue list")
    assert body["deployments"] == [{"deployment": deployment.name,
                                    "model": deployment.served_model_name, "rps": None,
                                    "shed_ps": None, "in_flight": None, "limit": None,
                                    "waiting": [], "in_flight_by_flow": []}]
    settings.PDSERVE_GATEWAY_PORT = 0
    assert api.get(URL).json()["gateway"] == "off"


def test_another_team_s_member_sees_none_of_it(
        deployment: Deployment, gateway_stub: GatewayStub) -> None:
    other = User.objects.create_user(username="other-admin", password="other-password-123")
    team = Team.objects.create(name="other-team")
    team.memberships.create(user=other, role="admin")
    client = APIClient()
    client.force_authenticate(other)
    assert client.get(URL).json()["deployments"] == []


def test_the_gateway_page_has_the_live_table(owner: User, deployment: Deployment) -> None:
    client = Client()
    assert client.login(username="owner", password=OWNER_PASSWORD)
    page = client.get("/gateway/").content.decode()
    assert 'data-api="/api/v1/gateway/traffic"' in page and "gateway/traffic.js" in page


@pytest.fixture
def two_replicas(settings: Any) -> Iterator[tuple[GatewayStub, GatewayStub]]:
    """Two stand-ins on consecutive ports, as PDSERVE_GATEWAY_REPLICAS=2 places replicas."""
    while True:
        first = GatewayStub()
        try:
            second = GatewayStub(first.server_address[1] + 1)
        except OSError:
            first.server_close()
            continue
        break
    for stub in (first, second):
        threading.Thread(target=stub.serve_forever, daemon=True).start()
    settings.PDSERVE_GATEWAY_PORT = first.server_address[1]
    settings.PDSERVE_GATEWAY_REPLICAS = 2
    yield first, second
    for stub in (first, second):
        stub.shutdown()
        stub.server_close()


def test_every_replicas_queues_are_summed(
        api: APIClient, deployment: Deployment,
        two_replicas: tuple[GatewayStub, GatewayStub]) -> None:
    first, second = two_replicas
    first.queues = {"deployments": [
        {"deployment": deployment.name, "in_flight": 3, "limit": 3,
         "waiting": [{"band": "low", "flow": "batch", "requests": 2}],
         "in_flight_by_flow": [{"flow": "batch", "requests": 3}]}]}
    second.queues = {"deployments": [
        {"deployment": deployment.name, "in_flight": 1, "limit": 3,
         "waiting": [{"band": "high", "flow": "web", "requests": 1},
                     {"band": "low", "flow": "batch", "requests": 4}],
         "in_flight_by_flow": [{"flow": "web", "requests": 1}]}]}
    [row] = api.get(URL).json()["deployments"]
    assert (row["in_flight"], row["limit"], row["waiting"]) == (4, 6, [
        {"band": "high", "flow": "web", "requests": 1},
        {"band": "low", "flow": "batch", "requests": 6}])
    assert row["in_flight_by_flow"] == [{"flow": "batch", "requests": 3},
                                        {"flow": "web", "requests": 1}]
    assert api.get(URL).json()["gateway"] == "running"

    # One replica down: the other's numbers, and which one could not be read.
    second.queues = {"unexpected": True}
    body = api.get(URL).json()
    assert body["gateway"].startswith("running; unreachable: gateway-1: GET /admin/queues: "
                                      "not a queue list")
    assert (body["deployments"][0]["in_flight"], body["deployments"][0]["limit"]) == (3, 3)
    first.queues = {"unexpected": True}
    assert api.get(URL).json()["gateway"].startswith("unreachable: gateway: GET /admin/queues")


def test_the_page_lists_each_replica(owner: User, deployment: Deployment,
                                     two_replicas: tuple[GatewayStub, GatewayStub]) -> None:
    first, _second = two_replicas
    ManagedProcess.objects.create(kind=ManagedProcess.Kind.GATEWAY, slot="gateway",
                                  role="gateway", port=first.server_address[1],
                                  state=ManagedProcess.State.READY, restarts=2)
    client = Client()
    assert client.login(username="owner", password=OWNER_PASSWORD)
    page = client.get("/gateway/").content.decode()
    assert 'id="gateway-state-gateway">ready<' in page
    assert 'id="gateway-state-gateway-1">not started' in page
    assert f"http://127.0.0.1:{first.server_address[1] + 1}" in page
