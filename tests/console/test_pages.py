"""The web console: login wall, the deployment list, the detail page and its buttons."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from console.deployments.models import Deployment
from console.live.models import LogLine
from console.supervisor.models import ManagedProcess
from tests.console.passwords import OWNER_PASSWORD
from tests.console.tiny_models import make_startable

State = ManagedProcess.State


@pytest.fixture
def browser(owner: User) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def detail_path(deployment: Deployment) -> str:
    return f"/deployments/{deployment.name}/"


def test_anonymous_users_are_sent_to_the_login_page(deployment: Deployment) -> None:
    client = Client()
    for path in ("/", detail_path(deployment), f"{detail_path(deployment)}processes/"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert response["Location"].startswith("/login/?next="), path


def test_a_deactivated_account_is_treated_as_anonymous(outsider: User,
                                                       deployment: Deployment) -> None:
    client = Client()
    client.force_login(outsider)
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_anonymous_buttons_change_nothing(deployment: Deployment) -> None:
    response = Client().post(f"{detail_path(deployment)}start/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.STOPPED


def test_login_form_logs_in_and_returns_to_the_list(owner: User, deployment: Deployment) -> None:
    client = Client()
    response = client.post("/login/", {"username": "owner", "password": OWNER_PASSWORD})
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert deployment.name in client.get("/").content.decode()


def test_login_form_rejects_a_wrong_password(owner: User) -> None:
    response = Client().post("/login/", {"username": "owner", "password": "wrong"})
    assert response.status_code == 200
    assert "Wrong username or password" in response.content.decode()


def test_list_page_shows_the_deployment(browser: Client, deployment: Deployment) -> None:
    response = browser.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'href="{detail_path(deployment)}"' in html
    assert "smollm2-1p1d" in html
    assert "shared-storage" in html
    assert 'class="state state-stopped"' in html


@pytest.fixture
def running_with_logs(deployment: Deployment, tmp_path: Path) -> Deployment:
    """The default deployment running, with a decode worker whose log has seven lines."""
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.DesiredState.RUNNING)
    log_path = tmp_path / "decode-0.log"
    log_path.write_text("".join(f"decode log line {n}\n" for n in range(1, 8)))
    ManagedProcess.objects.create(deployment=deployment, slot="decode-0", role="decode", port=8200,
                                  pid=43210, state=State.READY, log_path=str(log_path))
    ManagedProcess.objects.create(deployment=deployment, slot="prefill-0", role="prefill",
                                  port=8100, pid=43211, state=State.FAILED, restarts=2,
                                  last_error="exited with code 3", log_path=str(tmp_path / "none"))
    deployment.refresh_from_db()
    return deployment


def _row(html: str, slot: str) -> str:
    start = html.index(f'<tr data-slot="{slot}">')
    return html[start:html.index("</tr>", start)]


def test_detail_page_shows_the_process_table(browser: Client, running_with_logs: Deployment) -> None:
    response = browser.get(detail_path(running_with_logs))
    assert response.status_code == 200
    html = response.content.decode()
    assert "<h1>smollm2-1p1d</h1>" in html
    assert 'id="deployment-state">failed<' in html

    decode = _row(html, "decode-0")
    for cell in ("<td>decode</td>", "<td>8200</td>", "<td>43210</td>", ">ready</span>"):
        assert cell in decode
    # Only the last five log lines are shown.
    for n in range(3, 8):
        assert f"decode log line {n}" in decode
    assert "decode log line 2" not in decode

    prefill = _row(html, "prefill-0")
    for cell in ("<td>prefill</td>", "<td>8100</td>", "<td>43211</td>", ">failed</span>",
                 "exited with code 3", "<td>2</td>"):
        assert cell in prefill


def test_detail_page_of_a_missing_deployment_is_404(browser: Client, deployment: Deployment) -> None:
    assert browser.get("/deployments/no-such-thing/").status_code == 404


def test_processes_partial_is_just_the_table(browser: Client, running_with_logs: Deployment) -> None:
    response = browser.get(f"{detail_path(running_with_logs)}processes/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<table class="processes">' in html
    assert "decode log line 7" in html
    # No page chrome: the page's script swaps this fragment into the existing page.
    for chrome in ("<html", "<head", "<h1>", 'id="start"', "Log out"):
        assert chrome not in html


def test_a_starting_workers_phase_follows_its_log_lines(
        browser: Client, deployment: Deployment, tmp_path: Path) -> None:
    """The phase vLLM's newest line opens since the start header, on the page the script
    refreshes; a ready worker and the router show none."""
    Deployment.objects.filter(pk=deployment.pk).update(desired_state=Deployment.DesiredState.RUNNING)
    started = timezone.now() - timedelta(seconds=95)
    decode = ManagedProcess.objects.create(
        deployment=deployment, slot="decode-0", role="decode", port=8200, pid=43210,
        state=State.STARTING, started_at=started, log_path=str(tmp_path / "d.log"))
    ManagedProcess.objects.create(deployment=deployment, slot="router", role="router",
                                  kind=ManagedProcess.Kind.ROUTER, port=8080, pid=43212,
                                  state=State.STARTING, log_path=str(tmp_path / "r.log"))
    lines = ["=== pdserve 2026-12-04T05:00:00+00:00 starting decode-0: python -m vllm",
             "INFO [gpu_model_runner.py] Starting to load model /models/smollm2...",
             "INFO [weight_utils.py] some line that opens no phase"]

    def table() -> str:
        return browser.get(f"{detail_path(deployment)}processes/").content.decode()

    def log(text: str) -> None:
        seq = LogLine.objects.filter(process=decode).count() + 1
        LogLine.objects.create(process=decode, seq=seq, created=timezone.now(), text=text)

    log(lines[0])
    assert '<span class="phase">starting, 1' in _row(table(), "decode-0")
    for text in lines[1:]:
        log(text)
    assert '<span class="phase">loading weights, 1' in _row(table(), "decode-0")
    log("INFO [backends.py] Compiling a graph for compile range (1, 2048)")
    assert "compiling" in _row(table(), "decode-0")
    assert 'class="phase"' not in _row(table(), "router")
    ManagedProcess.objects.filter(pk=decode.pk).update(state=State.READY)
    assert 'class="phase"' not in _row(table(), "decode-0")


def test_detail_page_without_processes_says_so(browser: Client, deployment: Deployment) -> None:
    html = browser.get(detail_path(deployment)).content.decode()
    assert "No processes: the deployment has not been started." in html


def test_start_button_records_the_wish_and_redirects(browser: Client,
                                                     deployment: Deployment) -> None:
    make_startable(deployment)  # start runs the pre-flight checks (tests/console/test_checks*.py)
    response = browser.post(f"{detail_path(deployment)}start/")
    assert response.status_code == 302
    assert response["Location"] == detail_path(deployment)
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.RUNNING


def test_stop_button_records_the_wish_and_redirects(browser: Client,
                                                    running_with_logs: Deployment) -> None:
    response = browser.post(f"{detail_path(running_with_logs)}stop/")
    assert response.status_code == 302
    assert response["Location"] == detail_path(running_with_logs)
    running_with_logs.refresh_from_db()
    assert running_with_logs.desired_state == Deployment.DesiredState.STOPPED


def test_buttons_refuse_get(browser: Client, deployment: Deployment) -> None:
    # A link prefetcher or a crawler following a GET must not start a deployment.
    assert browser.get(f"{detail_path(deployment)}start/").status_code == 405
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.STOPPED


def test_buttons_need_the_csrf_token(owner: User, deployment: Deployment) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(f"{detail_path(deployment)}start/").status_code == 403
    deployment.refresh_from_db()
    assert deployment.desired_state == Deployment.DesiredState.STOPPED


def test_no_template_comment_spans_lines() -> None:
    """Django's ``{# #}`` ends at the line's end: one spanning lines is shown on the page as
    text (the rollout page showed one). Longer comments take ``{% comment %}``."""
    templates = Path(__file__).resolve().parents[2] / "templates"
    spanning = [f"{path.relative_to(templates)}:{number}"
                for path in sorted(templates.rglob("*.html"))
                for number, line in enumerate(path.read_text().splitlines(), start=1)
                if "{#" in line and "#}" not in line.split("{#", 1)[1]]
    assert spanning == []
