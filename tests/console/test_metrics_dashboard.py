"""The dashboard page: behind the login, linked from the deployment, charts from vendored files."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client

from console.deployments.models import Deployment


def dashboard_path(deployment: Deployment) -> str:
    return f"/deployments/{deployment.name}/dashboard/"


def test_the_dashboard_renders_for_a_logged_in_user(owner: User, deployment: Deployment) -> None:
    client = Client()
    client.force_login(owner)
    response = client.get(dashboard_path(deployment))
    assert response.status_code == 200
    page = response.content.decode()
    assert f'data-history="/api/v1/deployments/{deployment.pk}/metrics"' in page
    assert f'data-ws="/ws/deployments/{deployment.pk}/live/"' in page
    for asset in ("vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css", "pdserve/dashboard.js"):
        assert f'"{settings.STATIC_URL}{asset}"' in page, asset
    assert "no hand-offs yet" in page
    # The deployment page links here.
    assert dashboard_path(deployment) in client.get(f"/deployments/{deployment.name}/").content.decode()


def test_anonymous_and_deactivated_users_are_sent_to_the_login_page(outsider: User,
                                                                    deployment: Deployment) -> None:
    deactivated = Client()
    deactivated.force_login(outsider)
    for client in (Client(), deactivated):
        response = client.get(dashboard_path(deployment))
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


def test_an_unknown_deployment_is_404(owner: User, db: None) -> None:
    client = Client()
    client.force_login(owner)
    assert client.get("/deployments/nope/dashboard/").status_code == 404


def test_the_chart_library_is_vendored_with_its_licence() -> None:
    # Offline consoles: nothing may come from a CDN.
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE"):
        assert finders.find(f"vendor/uplot/{name}"), name
    script = finders.find("vendor/uplot/uPlot.iife.min.js")
    assert isinstance(script, str)
    with open(script, encoding="utf-8") as handle:
        assert handle.read(80).startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
