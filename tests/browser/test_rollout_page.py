"""The rollout page in a browser, on a console served by uvicorn (websockets and all): what the
supervisor stores in another process (transitions and analysis windows) reaches the page without
a reload, through the console's hub (embedded mode) and the deployment's live socket, and the
buttons follow the state; a viewer sees the rollout and no buttons.

The rows are written as the supervisor's rollout runner writes them
(console/control/rollout_runner.py), from ``manage.py shell`` against the console's database.
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

PASSWORD = "roll-it-out-slowly"
AT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")  # a transition's time, UTC
LIVE_S = 15_000  # ms: the hub polls every 0.1 s; a shell process takes a few seconds to start

# A team with an operator and a viewer; a running tiny PD plan of the team with its live
# revision r1, a draft r2 on another variant, and a canary rollout from r1 to r2 (starting)
# that verifies green before blue is drained.
SETUP = """
import json
import re
from pathlib import Path
from django.contrib.auth.models import User
from console.accounts.models import Membership, Role, Team
from console.catalog.models import Variant
from console.deployments.models import Deployment
from console.rollouts import revisions, services
from tests.console.tiny_models import make_plan, make_startable, register

root = Path({root!r})
root.mkdir(exist_ok=True)
team, _ = Team.objects.get_or_create(name="rollers")
users = {{}}
for name, role in (("roll-operator", Role.OPERATOR), ("roll-viewer", Role.VIEWER)):
    user = User.objects.filter(username=name).first()
    if user is None:
        user = User.objects.create_user(name, "", {password!r})
        Membership.objects.create(team=team, user=user, role=role)
    users[name] = user
# One running plan at a time: the plans of a module's tests share the node's cores.
Deployment.objects.update(desired_state=Deployment.DesiredState.STOPPED)
plan = make_startable(make_plan(root, name={name!r}, team=team))
Deployment.objects.filter(pk=plan.pk).update(desired_state=Deployment.DesiredState.RUNNING)
plan.refresh_from_db()
blue = revisions.ensure_live(plan)
green_variant = (Variant.objects.filter(base=plan.base_model, name="green").first()
                 or register(plan.base_model, root, "green"))
draft, report = revisions.create_draft(plan, {{}}, {{"prefill": green_variant,
                                                    "decode": green_variant}}, None, "green")
assert report.ok, report.errors
rollout = services.start(plan, draft, "canary", users["roll-operator"], verify_green=True)
print(json.dumps({{"rollout": rollout.pk, "blue": blue.number, "green": draft.number,
                  "weights": rollout.weights, "state": rollout.state}}))
"""

# What the supervisor stores, in its name.
SUPERVISOR = """
from django.utils import timezone
from console.audit.actors import acting_as
from console.audit.models import AuditEntry
from console.rollouts.machine import move
from console.rollouts.models import AnalysisRun, Rollout

rollout = Rollout.objects.select_related("from_revision", "to_revision").get(pk={pk})
with acting_as(AuditEntry.Actor.SYSTEM, "supervisor"):
{body}
"""

# Green became ready and passed its gate; step 1 holds, and its first window passes.
STEP_ONE = """
    move(rollout, "gating", "green's workers are ready; the output gate scores them before any "
         "traffic", gate={"state": "queued"})
    move(rollout, "stepping", "green passed the output gate; step 1 of 3: green takes 10%",
         gate={"state": "passed"}, weights={"1": 90, "2": 10}, step_index=0,
         step_since=timezone.now(), failures=0)
    AnalysisRun.objects.create(rollout=rollout, step_index=0, window_s=10.0, verdict="pass",
        requests={"1": 180, "2": 20}, metrics={
            "error_rate": {"green": 0.0, "blue": 0.005, "limit": 0.01, "verdict": "pass",
                           "why": "0 <= 0.01"},
            "ttft_p95": {"green": 0.2148793103448275, "blue": 0.2, "limit": 0.3,
                         "verdict": "pass", "why": "0.2149 <= 1.5 x blue 0.2"}})
"""

# Green's own verification report asked for and running, as the runner stores it.
VERIFYING = """
    from console.verification.models import VerificationReport
    report = VerificationReport.objects.create(deployment=rollout.deployment, trigger="green",
                                               revision=2, budget_s=300, state="running")
    Rollout.objects.filter(pk=rollout.pk).update(verification=report, progress={
        **rollout.progress, "verification": {"report": report.pk, "state": "running",
                                             "verdict": ""}})
    print(report.pk)
"""

# Two failed windows (the limit is one) and the runner rolls back: green's weight goes to 0.
ROLL_BACK = """
    failing = {
        "error_rate": {"green": 0.25, "blue": 0.005, "limit": 0.01, "verdict": "fail",
                       "why": "0.25 > 0.01"},
        "ttft_p95": {"green": 0.22, "blue": 0.2, "limit": 0.3, "verdict": "pass",
                     "why": "0.22 <= 1.5 x blue 0.2"}}
    for failures in (1, 2):
        AnalysisRun.objects.create(rollout=rollout, step_index=0, window_s=10.0, verdict="fail",
                                   requests={"1": 180, "2": 20}, metrics=failing)
        Rollout.objects.filter(pk=rollout.pk).update(failures=failures)
    rollout.refresh_from_db()
    move(rollout, "rolling_back", "analysis failed 2 times (limit 1): error_rate 0.25 > 0.01",
         weights={"1": 100, "2": 0})
"""

# An operator's pause or resume, as the REST API makes it.
PAUSE = """
from django.contrib.auth.models import User
from console.audit.actors import acting_as
from console.audit.models import AuditEntry
from console.rollouts import services
from console.rollouts.models import Rollout

with acting_as(AuditEntry.Actor.COMMAND, "rollout", User.objects.get(username="roll-operator")):
    services.{mover}(Rollout.objects.get(pk={pk}))
"""


def _world(console: LiveConsole, root: Path, name: str) -> dict[str, Any]:
    out = django_shell(console, SETUP.format(root=str(root), password=PASSWORD, name=name))
    return json.loads(out.strip().splitlines()[-1])


def _supervisor(console: LiveConsole, pk: int, body: str) -> None:
    django_shell(console, SUPERVISOR.format(pk=pk, body=body.strip("\n")))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveConsole]:
    with live_console(tmp_path_factory.mktemp("rollout-console")) as live:
        yield live


@contextmanager
def _open(browser: Browser, console: LiveConsole, username: str, pk: int) -> Iterator[Page]:
    with signed_in(browser, console.url, username, PASSWORD) as page:
        page.context.add_init_script(COUNT_LIVE_SOCKETS)
        page.goto(f"/rollouts/{pk}/")
        # Only rows stored after the hub's first poll are broadcast: the socket is open first.
        page.wait_for_function("window.__liveSockets > 0", timeout=LIVE_S)
        page.evaluate("window.__notReloaded = true")
        yield page


@pytest.fixture
def operator_page(browser: Browser, console: LiveConsole, tmp_path: Path
                  ) -> Iterator[tuple[Page, dict[str, Any]]]:
    world = _world(console, tmp_path / "models", "canary-live")
    with _open(browser, console, "roll-operator", world["rollout"]) as page:
        yield page, world


@pytest.fixture
def viewer_page(browser: Browser, console: LiveConsole, tmp_path: Path
                ) -> Iterator[tuple[Page, dict[str, Any]]]:
    world = _world(console, tmp_path / "models", "canary-viewed")
    with _open(browser, console, "roll-viewer", world["rollout"]) as page:
        yield page, world


def _width(page: Page, color: str) -> str:
    return str(page.locator(f"#weight-{color}").evaluate("node => node.style.width"))


def _button(page: Page, name: str) -> Any:
    return page.locator(f"#rollout-actions button#{name}")


def _not_reloaded(page: Page, navigations: list[str]) -> None:
    assert page.evaluate("window.__notReloaded") is True
    assert navigations == []


def test_supervisor_moves_reach_the_rollout_page_live(
        operator_page: tuple[Page, dict[str, Any]], console: LiveConsole) -> None:
    page, world = operator_page
    assert (world["blue"], world["green"], world["weights"]) == (1, 2, {"1": 100, "2": 0})
    navigations: list[str] = []
    page.on("framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    expect(page.locator("h1")).to_contain_text("r1 → r2")
    expect(page.locator("#rollout-state")).to_have_text("starting")
    expect(page.locator("#weight-text")).to_have_text("blue r1 100% · green r2 0%")
    assert _width(page, "green") == "0%" and _width(page, "blue") == "100%"
    expect(page.locator("#rollout-step")).to_have_text("1 of 3: green 10%, hold 60 s")
    expect(page.locator("#check-gate .verdict")).to_have_text("not run")
    expect(page.locator("#transitions tbody tr")).to_have_count(1)
    # Starting: pause and roll back; nothing to resume, and green has no traffic to promote.
    expect(_button(page, "pause")).to_be_visible()
    expect(_button(page, "rollback")).to_be_visible()
    expect(_button(page, "resume")).to_be_hidden()
    expect(_button(page, "promote")).to_be_hidden()

    _supervisor(console, world["rollout"], STEP_ONE)

    expect(page.locator("#rollout-state")).to_have_text("stepping", timeout=LIVE_S)
    expect(page.locator("#weight-text")).to_have_text("blue r1 90% · green r2 10%")
    assert _width(page, "green") == "10%" and _width(page, "blue") == "90%"
    expect(page.locator("#rollout-reason")).to_contain_text("step 1 of 3: green takes 10%")
    expect(page.locator("#check-gate .verdict")).to_have_text("passed")
    expect(page.locator("#check-error_rate .verdict")).to_have_text("pass")
    expect(page.locator("#check-error_rate")).to_contain_text("0 <= 0.01")
    expect(page.locator("#check-ttft_p95 .verdict")).to_have_text("pass")
    # Measures shown to 4 decimals, as the reason gives them, not as the float was stored.
    expect(page.locator("#check-ttft_p95")).to_contain_text("0.2149")
    expect(page.locator("#check-ttft_p95")).not_to_contain_text("0.21487")
    rows = page.locator("#transitions tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(1).locator("td")).to_have_text(
        [AT, "starting", "gating", "supervisor", re.compile("workers are ready"), "r1 100% r2 0%"])
    expect(rows.last.locator("td")).to_have_text(
        [AT, "gating", "stepping", "supervisor", re.compile("green takes 10%"), "r1 90% r2 10%"])
    expect(page.locator("#rollout-failures")).to_have_text("0 (limit 1)")
    # Stepping: pause, promote and roll back.
    expect(_button(page, "pause")).to_be_visible()
    expect(_button(page, "promote")).to_be_visible()
    expect(_button(page, "rollback")).to_be_visible()
    expect(_button(page, "resume")).to_be_hidden()
    _not_reloaded(page, navigations)

    _supervisor(console, world["rollout"], ROLL_BACK)

    expect(page.locator("#rollout-state")).to_have_text("rolling_back", timeout=LIVE_S)
    expect(page.locator("#rollout-reason")).to_have_text(
        "analysis failed 2 times (limit 1): error_rate 0.25 > 0.01")
    expect(page.locator("#weight-text")).to_have_text("blue r1 100% · green r2 0%")
    assert _width(page, "green") == "0%" and _width(page, "blue") == "100%"
    expect(page.locator("#check-error_rate .verdict")).to_have_text("fail")
    expect(page.locator("#check-error_rate")).to_contain_text("0.25 > 0.01")
    expect(page.locator("#check-ttft_p95 .verdict")).to_have_text("pass")
    expect(page.locator("#checks tbody tr")).to_have_count(3)  # the gate and two metrics
    expect(page.locator("#rollout-failures")).to_have_text("2 (limit 1)")
    expect(rows).to_have_count(4)
    expect(rows.last.locator("td")).to_have_text(
        [AT, "stepping", "rolling_back", "supervisor", re.compile("analysis failed 2 times"),
         "r1 100% r2 0%"])
    # Rolling back: nothing left to press.
    for name in ("pause", "promote", "resume", "rollback"):
        expect(_button(page, name)).to_be_hidden()
    _not_reloaded(page, navigations)

    # A reload renders what the socket showed.
    page.reload()
    expect(page.locator("#rollout-state")).to_have_text("rolling_back")
    expect(page.locator("#weight-text")).to_have_text("blue r1 100% · green r2 0%")
    expect(page.locator("#check-error_rate .verdict")).to_have_text("fail")
    expect(page.locator("#transitions tbody tr")).to_have_count(4)
    expect(page.locator("#transitions tbody tr").last.locator("td")).to_have_text(
        [AT, "stepping", "rolling_back", "supervisor", re.compile("analysis failed 2 times"),
         "r1 100% r2 0%"])
    for name in ("pause", "promote", "resume", "rollback"):
        expect(_button(page, name)).to_be_hidden()


def test_a_viewer_sees_the_rollout_live_and_no_buttons(
        viewer_page: tuple[Page, dict[str, Any]], console: LiveConsole) -> None:
    page, world = viewer_page
    expect(page.locator("#rollout-state")).to_have_text("starting")
    expect(page.locator("#weight-text")).to_have_text("blue r1 100% · green r2 0%")
    expect(page.locator("#rollout-actions")).to_have_count(0)
    expect(page.locator("#rollout button, #rollout form")).to_have_count(0)

    _supervisor(console, world["rollout"], STEP_ONE)

    expect(page.locator("#rollout-state")).to_have_text("stepping", timeout=LIVE_S)
    expect(page.locator("#weight-text")).to_have_text("blue r1 90% · green r2 10%")
    expect(page.locator("#check-error_rate .verdict")).to_have_text("pass")
    expect(page.locator("#rollout button, #rollout form")).to_have_count(0)
    expect(page.locator("#paused-from")).to_have_text("")

    # An operator pauses from elsewhere, then resumes: the paused-from note comes and goes.
    django_shell(console, PAUSE.format(pk=world["rollout"], mover="pause"))
    expect(page.locator("#rollout-state")).to_have_text("paused", timeout=LIVE_S)
    expect(page.locator("#paused-from")).to_have_text("(from stepping)")
    expect(page.locator("#weight-text")).to_have_text("blue r1 90% · green r2 10%")
    django_shell(console, PAUSE.format(pk=world["rollout"], mover="resume"))
    expect(page.locator("#rollout-state")).to_have_text("stepping", timeout=LIVE_S)
    expect(page.locator("#paused-from")).to_have_text("")
    expect(page.locator("#transitions tbody tr").last.locator("td")).to_have_text(
        [AT, "paused", "stepping", "roll-operator", "resumed by an operator", "r1 90% r2 10%"])
    expect(page.locator("#rollout button, #rollout form")).to_have_count(0)

    # Green's own verification, asked before blue is drained, shows up and links its report.
    expect(page.locator("#rollout-verification")).to_contain_text("before blue is drained")
    out = django_shell(console, SUPERVISOR.format(pk=world["rollout"], body=VERIFYING.strip("\n")))
    report = int(out.strip().splitlines()[-1])
    expect(page.locator("#rollout-verification")).to_have_text(f"report #{report}: running",
                                                               timeout=LIVE_S)
    expect(page.locator("#rollout-verification a")).to_have_attribute(
        "href", f"/verifications/{report}/")
    assert page.evaluate("window.__notReloaded") is True
