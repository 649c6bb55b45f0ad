"""The API keys page in a browser: a new key is shown once, its Copy button puts it on the
clipboard, a reload does not show it again, and Revoke marks it revoked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Browser, Page, expect
from pytest_django.live_server_helper import LiveServer

from console.deployments.models import Deployment
from console.gateway.models import ApiKey
from inference.router.keys import key_hash
from tests.chromium import signed_in
from tests.console.tiny_models import make_plan

PASSWORD = "browser-pass-123"


@pytest.fixture
def plan(transactional_db: None, tmp_path: Path, settings: Any) -> Deployment:
    settings.DATA_DIR = tmp_path / "data"
    User.objects.create_superuser(username="operator", email="", password=PASSWORD)
    return make_plan(tmp_path)


@pytest.fixture
def page(browser: Browser, live_server: LiveServer, plan: Deployment) -> Iterator[Page]:
    with signed_in(browser, live_server.url, "operator", PASSWORD,
                   permissions=["clipboard-read", "clipboard-write"]) as page:
        yield page


def test_a_key_is_shown_once_copied_and_revoked(page: Page, plan: Deployment) -> None:
    page.click("nav >> text=API keys")
    expect(page.locator("h1")).to_have_text("API keys")
    page.fill("input[name=name]", "browser key")
    page.check(f"input[name=deployments][value={plan.name}]")
    page.fill("input[name=max_concurrency]", "3")
    page.click("#key-form button[type=submit]")

    shown = page.locator("#new-key-value").inner_text()
    assert ApiKey.objects.get().key_hash == key_hash(shown)
    page.click("#copy-key")
    expect(page.locator("#copy-done")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == shown

    page.goto("/keys/")
    assert shown not in page.content()
    row = page.locator("tr[data-key]")
    expect(row).to_contain_text("browser key")
    expect(row).to_contain_text("never")
    row.locator("button", has_text="Revoke").click()
    expect(page.locator("tr[data-key]")).to_contain_text("revoked")
