"""Debian's headless Chromium driven by Playwright, for every browser test: one launcher and one
signed-in page, so that the flags and the login live in one place.

`make test` installs Chromium (`make browser`); Playwright's own browser download is never used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Instrumentation for a page's init script, before any script of the page runs: how many live
# sockets (/ws/.../live/) it opened, in window.__liveSockets (a reload or a reconnect shows).
COUNT_LIVE_SOCKETS = """
window.__liveSockets = 0;
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    if (String(args[0]).includes("/live/")) {
      this.addEventListener("open", () => { window.__liveSockets += 1; });
    }
  }
};
"""
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@contextmanager
def launched() -> Iterator[Browser]:
    """Use it from a module-scoped fixture: while Playwright runs, this thread has an event
    loop, which async tests that follow in the same session must not find."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (Debian's chromium package)")
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        # Playwright's sync API keeps an event loop in this thread; Django then refuses ORM
        # calls from it (fixtures, assertions), although they never overlap with the loop.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def signed_in(browser: Browser, console: str, username: str, password: str,
              permissions: Sequence[str] = ()) -> Iterator[Page]:
    """A page of ``console`` past its login form, on the deployments list."""
    context = browser.new_context(base_url=console)
    if permissions:
        context.grant_permissions(list(permissions))
    page = context.new_page()
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Deployments")
    try:
        yield page
    finally:
        context.close()
