"""The console in a real browser (Debian's headless Chromium driven by Playwright) against the
real default deployment: live log lines arrive without a reload, a dropped websocket is made
good by the REST backfill with every line exactly once, and the playground answers."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.chromium import launched, signed_in
from tests.e2e.conftest import ADMIN_PASSWORD, Stack
from tests.e2e.test_default_deployment import QUESTION

pytestmark = pytest.mark.vllm

@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as browser:
        yield browser


@pytest.fixture
def page(browser: Browser, stack: Stack) -> Iterator[Page]:
    with signed_in(browser, stack.console, "admin", ADMIN_PASSWORD) as page:
        yield page


def _router_process_id(stack: Stack) -> int:
    return next(p["id"] for p in stack.deployment()["processes"] if p["slot"] == "router")


def _ask(stack: Stack, request_id: str) -> None:
    response = httpx.post(f"{stack.router}/v1/completions", timeout=120,
                          headers={"X-Request-Id": request_id},
                          json={"model": "smollm2", "prompt": "Hello", "max_tokens": 2})
    assert response.status_code == 200


def _shown_seqs(page: Page) -> list[int]:
    return page.eval_on_selector_all("#log .logline", "rows => rows.map(r => Number(r.dataset.seq))")


def test_deployment_page_shows_every_process_ready(page: Page) -> None:
    page.click("text=smollm2-1p1d")
    for slot in ("prefill-0", "decode-0", "router"):
        row = page.locator(f"tr[data-slot='{slot}']")
        expect(row.locator(".state")).to_have_text("ready")


def test_log_lines_arrive_live_and_a_dropped_socket_loses_nothing(page: Page,
                                                                  stack: Stack) -> None:
    page.goto(f"/processes/{_router_process_id(stack)}/log/")
    expect(page.locator("#log-status")).to_have_text("live", timeout=10_000)

    live_id = f"browser-live-{uuid.uuid4().hex[:8]}"
    _ask(stack, live_id)
    expect(page.locator("#log .logline", has_text=live_id)).to_have_count(1, timeout=10_000)

    # Drop the socket; lines written while it is down must come back through the backfill.
    page.evaluate("window.pdserveLogTail.ws.close()")
    missed = [f"browser-missed-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    for request_id in missed:
        _ask(stack, request_id)
    for request_id in missed:
        expect(page.locator("#log .logline", has_text=request_id)).to_have_count(1, timeout=15_000)
    expect(page.locator("#log-status")).to_have_text("live")

    seqs = _shown_seqs(page)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap or duplicate in the log view"
    stored = httpx.get(f"{stack.console}/api/v1/processes/{_router_process_id(stack)}/logs",
                       params={"tail": 1},
                       headers={"Authorization": f"Token {stack.token}"}).json()["lines"]
    assert seqs[-1] == stored[-1]["seq"]


def test_playground_answers_with_ttft_and_tpot(page: Page, stack: Stack) -> None:
    page.goto("/deployments/smollm2-1p1d/playground/")
    # The README's question, with its system prompt (a bf16 greedy answer needs it).
    page.fill("textarea[name=system]", QUESTION[0]["content"])
    page.fill("textarea[name=prompt]", QUESTION[1]["content"])
    page.click("#send")
    answer = page.locator(".bubble.assistant")
    expect(answer).to_contain_text("Paris", timeout=60_000)
    stats = page.locator(".stats")
    expect(stats).to_contain_text(re.compile(r"TTFT \d+ ms · TPOT [\d.]+ ms"), timeout=60_000)
    assert float(stats.get_attribute("data-ttft-ms")) > 0
    # The timeline link finds the request in the router's log.
    stats.locator("a", has_text="timeline").click()
    expect(page.locator("#timeline tr[data-event='first_token']")).to_have_count(1,
                                                                                  timeout=10_000)


def test_dashboard_chart_points_arrive_without_reload(page: Page, stack: Stack) -> None:
    page.goto("/deployments/smollm2-1p1d/dashboard/")
    page.wait_for_function("window.pdserveDashboard && window.pdserveDashboard.charts.length > 0")
    count = "Math.max(...window.pdserveDashboard.charts.map(c => c.times.length))"
    before = page.evaluate(count)
    _ask(stack, f"browser-dashboard-{uuid.uuid4().hex[:8]}")
    # One snapshot a second: a few seconds later every chart has grown, with no navigation.
    page.wait_for_function(f"{count} >= {before} + 3", timeout=15_000)
    navigations = page.evaluate("performance.getEntriesByType('navigation').length")
    assert navigations == 1
