"""The metric history API the dashboard loads when it opens."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.deployments.models import Deployment
from console.live.api.views import MAX_POINTS
from console.live.models import MetricSample
from tests.console.tokens import token_for


@pytest.fixture
def api(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def store(deployment: Deployment, resolution: str, at: datetime, rps: float) -> None:
    MetricSample.objects.create(deployment=deployment, resolution=resolution, created=at,
                                data={"processes": {"router": {"role": "router", "rps": rps}}})


def url(deployment: Deployment, window: str = "") -> str:
    query = f"?window={window}" if window else ""
    return f"/api/v1/deployments/{deployment.pk}/metrics{query}"


def rps(body: dict[str, object]) -> list[float]:
    return [s["data"]["processes"]["router"]["rps"] for s in body["samples"]]  # type: ignore[index]


def test_fifteen_minutes_come_at_one_second(api: Client, deployment: Deployment) -> None:
    now = timezone.now()
    store(deployment, "1s", now - timedelta(minutes=16), 99.0)  # outside the window
    for age in (3, 2, 1):
        store(deployment, "1s", now - timedelta(seconds=age), float(age))
    store(deployment, "1m", now - timedelta(minutes=5), 50.0)  # other resolution
    body = api.get(url(deployment)).json()  # 15m is the default
    assert (body["window"], body["resolution"], body["step_s"]) == ("15m", "1s", 1)
    assert rps(body) == [3.0, 2.0, 1.0]
    # The same timestamps as the websocket messages carry, so the page can tell overlaps.
    assert body["samples"][0]["at"] == (now - timedelta(seconds=3)).isoformat()


def test_an_hour_comes_at_one_minute_including_the_minutes_not_rolled_up_yet(
        api: Client, deployment: Deployment) -> None:
    minute = timezone.now().replace(second=0, microsecond=0)
    store(deployment, "1m", minute - timedelta(minutes=30), 5.0)
    store(deployment, "1m", minute - timedelta(minutes=2), 7.0)
    # The last complete minute and the current one exist only as 1 s samples so far.
    for at, value in ((minute - timedelta(seconds=50), 1.0), (minute - timedelta(seconds=10), 3.0),
                      (minute, 10.0)):
        store(deployment, "1s", at, value)
    body = api.get(f"/api/v1/deployments/{deployment.pk}/metrics/?window=1h").json()
    assert (body["resolution"], body["step_s"]) == ("1m", 60)
    assert rps(body) == [5.0, 7.0, 2.0, 10.0]


def test_a_week_is_merged_into_a_bounded_number_of_points(api: Client, deployment: Deployment) -> None:
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(days=7) + timedelta(hours=1)
    MetricSample.objects.bulk_create([
        MetricSample(deployment=deployment, resolution="1m", created=start + timedelta(minutes=i),
                     data={"processes": {"router": {"rps": 1.0 if i % 2 else 3.0}}})
        for i in range(0, 7 * 24 * 60 - 120)
    ])
    body = api.get(url(deployment, "7d")).json()
    assert body["step_s"] == 12 * 60
    assert len(body["samples"]) <= MAX_POINTS
    # Averages of the merged minutes, not a pick of some of them.
    assert set(rps(body)[1:-1]) == {2.0}


@pytest.mark.parametrize("window", ["5m", "1d", "", "15"])
def test_a_bad_window_is_a_400_naming_the_field(api: Client, deployment: Deployment,
                                                window: str) -> None:
    response = api.get(f"/api/v1/deployments/{deployment.pk}/metrics?window={window}")
    assert response.status_code == 400
    assert "window" in response.json()


def test_history_needs_a_login_and_an_existing_deployment(api: Client, outsider: User,
                                                          deployment: Deployment) -> None:
    assert Client().get(url(deployment)).status_code in (401, 403)
    deactivated = Client()
    deactivated.force_login(outsider)
    assert deactivated.get(url(deployment)).status_code in (401, 403)
    assert api.get("/api/v1/deployments/999999/metrics").status_code == 404


def test_token_clients_can_read_history(owner: User, deployment: Deployment) -> None:
    response = Client().get(url(deployment, "24h"), HTTP_AUTHORIZATION=f"Token {token_for(owner)}")
    assert response.status_code == 200
    assert response.json()["step_s"] == 120
