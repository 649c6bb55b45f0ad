"""The models page in a real browser: starting a quantization job from its form, the progress
bar moves and the job ends registered, all without reloading the page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.chromium import launched, signed_in
from tests.quant.conftest import ADMIN_PASSWORD, QuantStack


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as browser:
        yield browser


@pytest.fixture
def page(browser: Browser, quant_stack: QuantStack) -> Iterator[Page]:
    with signed_in(browser, quant_stack.console, "admin", ADMIN_PASSWORD) as page:
        yield page


def test_the_progress_bar_moves_without_a_reload(page: Page) -> None:
    page.goto("/models/")
    form = page.locator('form.quantize-form[data-model="tiny"]')
    form.locator("select[name$=scheme]").select_option("w8a8-int8")
    form.locator("select[name$=method]").select_option("gptq")
    form.locator("input[name$=name]").fill("w8-browser")
    form.locator("button[type=submit]").click()
    row = page.locator("tr[data-job]", has_text="tiny/w8-browser")
    expect(row).to_be_visible()
    page.evaluate("window.notReloaded = true")

    values: list[float] = []
    for _ in range(600):
        # One snapshot of value and state: read apart, a refresh landing between the two reads
        # pairs an old value with the final state.
        value, state = row.evaluate(
            "r => [r.querySelector('progress').getAttribute('value'), r.dataset.state]"
        )
        if not values or float(value or 0) != values[-1]:
            values.append(float(value or 0))
        if state not in ("queued", "running"):
            break
        page.wait_for_timeout(100)
    expect(row).to_have_attribute("data-state", "succeeded")
    assert len([v for v in values if 0 < v < 100]) >= 2, values
    assert values == sorted(values) and values[-1] == 100
    assert page.evaluate("window.notReloaded") is True
    # The variant table, refreshed the same way, lists the new variant.
    expect(page.locator('tr[data-variant="tiny/w8-browser"]')).to_contain_text("w8a8")
