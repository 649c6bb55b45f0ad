"""The alert dashboard in a browser, on a console served by uvicorn (websockets and all): an
alert that the evaluator fires in another process appears on the dashboard and in the
navigation bar's count without a reload, and a silence made from the page mutes it.

The evaluator runs as the supervisor runs it, in a process of its own against the console's
database (``manage.py shell``), over snapshots stored the way the collector stores them; the
console's hub (embedded mode) broadcasts the alert events it stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.chromium import signed_in
from tests.fuzz.live_console import PASSWORD, USERNAME, LiveConsole, django_shell, live_console

# A running PD deployment whose decode worker has been restarted (so not a first start) and
# whose latest snapshot says decode does not answer: worker down, at the next tick.
SETUP = """
from datetime import timedelta
from pathlib import Path
from django.utils import timezone
from console.alerts.evaluation import Evaluator
from console.deployments.defaults import ensure_default_deployment
from console.deployments.models import Deployment
from console.live.models import MetricSample
from console.supervisor.models import ManagedProcess

model = Path({model!r})
model.mkdir(exist_ok=True)
deployment, _ = ensure_default_deployment(model_dir=model)
Deployment.objects.filter(pk=deployment.pk).update(desired_state="running")
now = timezone.now()
for slot, role in (("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")):
    ManagedProcess.objects.create(deployment=deployment, slot=slot, role=role, port=1,
                                  state="ready", ready_at=now - timedelta(minutes=5), restarts=1,
                                  log_path="/dev/null")
def entry(role, up):
    return {{"role": role, "up": up, "cpu": 1.0, "rss": 1 << 20}}
MetricSample.objects.create(deployment=deployment, resolution="1s", created=now,
    data={{"processes": {{"prefill-0": entry("prefill", 1), "decode-0": entry("decode", 0),
                         "router": entry("router", 1)}}}})
print(Evaluator(holder="browser-test").tick(now + timedelta(seconds=1)))
"""


@pytest.fixture
def console(tmp_path: Path) -> Iterator[LiveConsole]:
    with live_console(tmp_path) as live:
        yield live


@pytest.fixture
def page(browser: Browser, console: LiveConsole) -> Iterator[Page]:
    with signed_in(browser, console.url, USERNAME, PASSWORD) as page:
        yield page


def test_an_alert_appears_live_and_a_silence_from_the_page_mutes_it(
        page: Page, console: LiveConsole, tmp_path: Path) -> None:
    page.goto(f"{console.url}/alerts/")
    expect(page.locator("#alert-empty")).to_be_visible()
    expect(page.locator("#nav-alert-count")).to_have_text("0")

    report = django_shell(console, SETUP.format(model=str(tmp_path / "model")))
    assert "evaluated=True" in report, report

    row = page.locator("#alert-table tbody tr", has_text="WorkerDown")
    expect(row).to_be_visible(timeout=15_000)  # no reload: the websocket brought it
    expect(row).to_contain_text("firing")
    expect(row).to_contain_text("decode-0")
    expect(page.locator("#nav-alert-count")).to_have_text("1")
    expect(page.locator("#alert-empty")).to_be_hidden()

    row.locator("form:has(button.silence) input[name=comment]").fill("restarting decode")
    row.locator("button.silence").click()
    muted = page.locator("#alert-table tbody tr", has_text="WorkerDown")
    expect(muted).to_contain_text("silenced by #1")
    silences = django_shell(console, "from console.alerts.models import Silence; "
                                "print([(s.comment, s.matchers) for s in Silence.objects.all()])")
    assert "restarting decode" in silences and "decode-0" in silences

    page.goto(f"{console.url}/")
    expect(page.locator("[data-alert-count-deployment]")).to_have_text("1")

    # An alert's "dashboard" link opens the deployment's dashboard on a window that shows when
    # it began: two hours ago is in the 24 h window, not the default 15 minutes.
    link = page.locator("a", has_text="smollm2-1p1d")
    began = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    page.goto(f"{link.get_attribute('href').rstrip('/')}/dashboard/?at={quote(began)}")
    expect(page.locator("#dashboard-windows button.selected")).to_have_text("24h")
