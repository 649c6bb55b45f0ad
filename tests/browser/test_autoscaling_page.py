"""The autoscaling page and the deployment page's events list in a browser, on a console served
by uvicorn (websockets and all): what the autoscaler stores in another process (pool readings and
decisions, new or extended) reaches the pages without a reload, through the console's hub
(embedded mode) and the deployment's live socket; an operator's mode switch changes the policy,
and a viewer's switch is disabled.

The rows are written as the autoscaler writes them (console/autoscaling/runner.py), from
``manage.py shell`` against the console's database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.chromium import COUNT_LIVE_SOCKETS, signed_in
from tests.fuzz.live_console import LiveConsole, django_shell, live_console

PASSWORD = "scale-it-up-slowly"
AT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # a decision's time, UTC
LIVE_S = 15_000  # ms: the hub polls every 0.1 s; a shell process takes a few seconds to start

# A team with an operator and a viewer; a tiny PD plan of the team whose decode pool has a
# dry-run policy on the queue signal, and no policy for prefill.
SETUP = """
import json
from pathlib import Path
from django.contrib.auth.models import User
from console.accounts.models import Membership, Role, Team
from console.autoscaling.models import PoolPolicy
from tests.console.tiny_models import make_plan

root = Path({root!r})
root.mkdir(exist_ok=True)
team, _ = Team.objects.get_or_create(name="scalers")
for name, role in (("scale-operator", Role.OPERATOR), ("scale-viewer", Role.VIEWER)):
    if not User.objects.filter(username=name).exists():
        user = User.objects.create_user(name, "", {password!r})
        Membership.objects.create(team=team, user=user, role=role)
plan = make_plan(root, name={name!r}, team=team)
PoolPolicy.objects.create(deployment=plan, role="decode", mode="dry_run", signal="queue",
                          min_instances=1, max_instances=3, scale_up_at=2.0, scale_down_at=0.5)
print(json.dumps({{"deployment": plan.pk}}))
"""

# One evaluation of the decode pool that asks for a second instance: its reading, and the
# dry run's decision (held by the up window).
EVALUATION = """
from django.utils import timezone
from console.autoscaling.models import PoolReading, ScalingDecision

now = timezone.now()
plan = {pk}
PoolReading.objects.create(deployment_id=plan, role="decode", at=now, value=3.25, asked=2,
                           current=1, ready=1, scale_up_at=2.0, scale_down_at=0.5,
                           mode="dry_run")
ScalingDecision.objects.create(
    deployment_id=plan, role="decode", at=now, last_at=now, signal="queue", value=3.25,
    inputs={{"waiting": 3.25, "instances": 1, "windows": {{"up_s": 60, "down_s": 300}}}},
    current=1, desired=2, target=2, action="up", reason="scaled",
    detail="asks for 2 over the window", dry_run=True,
    progress={{"decided_at": now.isoformat()}})
"""

# The next evaluations decide the same: the autoscaler extends the stored decision, whose
# `changed` time the save moves (what the hub polls for).
EXTENDED = """
from django.utils import timezone
from console.autoscaling.models import ScalingDecision

decision = ScalingDecision.objects.filter(deployment_id={pk}).latest("at")
decision.evaluations, decision.last_at = 3, timezone.now()
decision.save()
"""

POLICY = """
from console.audit.models import AuditEntry
from console.autoscaling.models import PoolPolicy

entry = AuditEntry.objects.filter(action="autoscaling.policy.update").latest("pk")
print(PoolPolicy.objects.get(deployment_id={pk}, role="decode").mode, entry.username,
      entry.changes["mode"])
"""


def _world(console: LiveConsole, root: Path, name: str) -> int:
    out = django_shell(console, SETUP.format(root=str(root), password=PASSWORD, name=name))
    return int(json.loads(out.strip().splitlines()[-1])["deployment"])


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveConsole]:
    with live_console(tmp_path_factory.mktemp("autoscaling-console")) as live:
        yield live


@contextmanager
def _open(browser: Browser, console: LiveConsole, username: str, path: str) -> Iterator[Page]:
    with signed_in(browser, console.url, username, PASSWORD) as page:
        page.context.add_init_script(COUNT_LIVE_SOCKETS)
        page.goto(path)
        # Only rows stored after the hub's first poll are broadcast: the socket is open first.
        page.wait_for_function("window.__liveSockets > 0", timeout=LIVE_S)
        page.evaluate("window.__notReloaded = true")
        yield page


def _points(page: Page, role: str) -> int:
    return int(page.evaluate(
        f"(window.pdserveAutoscaling.charts[{role!r}] || {{times: []}}).times.length"))


def _decision_cells(page: Page, table: str) -> Any:
    return page.locator(f"#{table} tbody tr[data-id]").first.locator("td")


def test_the_autoscalers_rows_reach_the_page_live(browser: Browser, console: LiveConsole,
                                                  tmp_path: Path) -> None:
    pk = _world(console, tmp_path / "models", "scaled-live")
    with _open(browser, console, "scale-viewer", "/deployments/scaled-live/autoscaling/") as page:
        expect(page.locator("#scaling-status")).to_have_text("live", timeout=LIVE_S)
        expect(page.locator("#pool-decode-current")).to_have_text("1")
        expect(page.locator("#pool-decode-desired")).to_have_text("—")
        expect(page.locator("#policy-prefill")).to_contain_text("No policy")
        expect(page.locator("#decisions tbody tr[data-id]")).to_have_count(0)
        expect(page.locator("#decisions tr.empty")).to_be_visible()
        assert _points(page, "decode") == 0
        # A viewer sees the mode and may not switch it.
        for role in ("prefill", "decode"):
            for button in page.locator(f"#mode-{role} button").all():
                expect(button).to_be_disabled()
        expect(page.locator("#mode-decode button.selected")).to_have_text("dry run")

        django_shell(console, EVALUATION.format(pk=pk))

        cells = _decision_cells(page, "decisions")
        expect(cells).to_have_text(
            [AT, "decode", "up dry run", "1 → 2", "2", "scaled", "asks for 2 over the window",
             "instances=1 waiting=3.25 windows.down_s=300 windows.up_s=60",
             re.compile(r"^decided \d\d:\d\d:\d\d$")], timeout=LIVE_S)
        expect(page.locator("#decisions tr.empty")).to_be_hidden()
        expect(page.locator("#pool-decode-desired")).to_have_text("2")
        expect(page.locator("#pool-decode-value")).to_have_text("3.25 (asks for 2)")
        page.wait_for_function("window.pdserveAutoscaling.charts.decode.times.length === 1",
                               timeout=LIVE_S)
        expect(page.locator("#chart-decode .uplot")).to_have_count(1)

        django_shell(console, EXTENDED.format(pk=pk))

        expect(cells.first).to_contain_text("×3 to ", timeout=LIVE_S)
        expect(page.locator("#decisions tbody tr[data-id]")).to_have_count(1)
        assert page.evaluate("window.__notReloaded") is True

        # A reload renders what the socket showed.
        page.reload()
        expect(_decision_cells(page, "decisions").first).to_contain_text("×3 to ")
        expect(page.locator("#pool-decode-value")).to_have_text("3.25 (asks for 2)")
        assert _points(page, "decode") == 1


def test_the_deployment_pages_events_list_is_live(browser: Browser, console: LiveConsole,
                                                  tmp_path: Path) -> None:
    pk = _world(console, tmp_path / "models", "scaled-events")
    with _open(browser, console, "scale-viewer", "/deployments/scaled-events/") as page:
        expect(page.locator("#autoscaling-link")).to_have_attribute(
            "href", "/deployments/scaled-events/autoscaling/")
        expect(page.locator("#scaling-events-table tr.empty")).to_be_visible()

        django_shell(console, EVALUATION.format(pk=pk))

        expect(_decision_cells(page, "scaling-events-table")).to_have_text(
            [AT, "decode", "up dry run", "1 → 2", "2", "scaled", "asks for 2 over the window",
             re.compile("waiting=3.25"), re.compile("^decided ")], timeout=LIVE_S)
        assert page.evaluate("window.__notReloaded") is True


def test_an_operator_switches_the_mode(browser: Browser, console: LiveConsole,
                                       tmp_path: Path) -> None:
    pk = _world(console, tmp_path / "models", "scaled-switch")
    with _open(browser, console, "scale-operator",
               "/deployments/scaled-switch/autoscaling/") as page:
        expect(page.locator("#mode-decode button.selected")).to_have_text("dry run")
        for button in page.locator("#mode-prefill button").all():
            expect(button).to_be_disabled()  # no policy to switch yet

        page.locator("#mode-decode button[value=active]").click()

        expect(page.locator("#mode-decode button.selected")).to_have_text("active")
        expect(page.locator("#pool-decode-mode")).to_have_text(
            "active (decisions change the pool)")
        assert django_shell(console, POLICY.format(pk=pk)).strip().splitlines()[-1].split() == [
            "active", "scale-operator", "['dry_run',", "'active']"]
