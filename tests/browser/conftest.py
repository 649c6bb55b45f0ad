"""The console in a real browser (tests/chromium.py) against pytest-django's live server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from console.celery import app
from tests.chromium import launched


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as browser:
        yield browser


@pytest.fixture(autouse=True)
def eager_celery() -> Iterator[None]:
    # The live server shares the test database, which a separate Celery worker cannot reach.
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False
