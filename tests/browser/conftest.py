"""A real browser for the console: Debian's headless Chromium, driven by Playwright.

`make test` installs Chromium (`make browser`); Playwright's own browser download is never used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

from console.celery import app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


# Module scope: while Playwright runs, this thread has an event loop, which async tests that
# follow in the same session must not find.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (Debian's chromium package)")
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        # Playwright's sync API keeps an event loop in this thread; Django then refuses ORM
        # calls from it (fixtures, assertions), although they never overlap with the loop.
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def eager_celery() -> Iterator[None]:
    # The live server shares the test database, which a separate Celery worker cannot reach.
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False
