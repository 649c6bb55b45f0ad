"""The plan page in a browser: edit a plan into a conflict and the check table turns red without
a reload; fix it and the row turns green."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from console.deployments.models import Deployment
from tests.chromium import signed_in
from tests.console.tiny_models import make_plan

PASSWORD = "browser-pass-123"
RED = "rgb(255, 233, 233)"
GREEN = "rgb(234, 250, 238)"


@pytest.fixture
def plan(transactional_db: None, tmp_path: Path) -> Deployment:
    User.objects.create_superuser(username="operator", email="", password=PASSWORD)
    return make_plan(tmp_path)


@pytest.fixture
def page(browser: Browser, live_server: LiveServer, plan: Deployment) -> Iterator[Page]:
    with signed_in(browser, live_server.url, "operator", PASSWORD) as page:
        yield page


def row(page: Page, check_id: str):  # noqa: ANN201 - a Playwright Locator
    return page.locator(f'tr[data-check="{check_id}"]')


def test_a_port_conflict_turns_the_row_red_and_a_fix_turns_it_green(page: Page,
                                                                   plan: Deployment) -> None:
    prefill_port = str(plan.workers.get(role="prefill").port)
    decode_port = str(plan.workers.get(role="decode").port)
    page.goto(f"/deployments/{plan.name}/edit/")
    expect(row(page, "port.conflict")).to_have_attribute("data-status", "pass")
    # A marker on the window survives only if the page is never reloaded.
    page.evaluate("window.notReloaded = true")

    decode_port_input = page.locator('input[name="decode-instances-0-port"]')
    decode_port_input.fill(prefill_port)
    conflict = row(page, "port.conflict")
    expect(conflict).to_have_attribute("data-status", "error")
    expect(conflict.locator("td").first).to_have_css("background-color", RED)
    expect(conflict).to_contain_text(f"port {prefill_port} on node")
    expect(conflict).to_contain_text("prefill-0 and decode-0")
    expect(page.locator("#check-summary")).to_contain_text("1 error: a start is refused")

    decode_port_input.fill(decode_port)
    expect(row(page, "port.conflict")).to_have_attribute("data-status", "pass")
    expect(row(page, "port.conflict").locator("td").first).to_have_css("background-color", GREEN)
    expect(page.locator("#check-summary")).to_contain_text("No errors")
    assert page.evaluate("window.notReloaded") is True

    # Nothing was saved by checking.
    assert str(plan.workers.get(role="decode").port) == decode_port


def test_adding_an_instance_proposes_free_values_and_rechecks(page: Page,
                                                            plan: Deployment) -> None:
    page.goto(f"/deployments/{plan.name}/edit/")
    page.click('fieldset[data-role="decode"] [data-add-instance]')
    new_port = page.locator('input[name="decode-instances-1-port"]')
    expect(new_port).not_to_have_value("")
    taken = {str(w.port) for w in plan.workers.all()} | {str(plan.router_port)}
    assert new_port.input_value() not in taken
    # Two cores, three workers: the proposal shares a core and the check says so.
    expect(row(page, "device.conflict")).to_have_attribute("data-status", "error")
    page.check('input[name="decode-instances-1-DELETE"]')
    expect(row(page, "device.conflict")).to_have_attribute("data-status", "pass")
