"""A verification of the session's borrowed tiny-model deployment (tests/borrowed.py), run the
way an operator runs it: ``POST /api/v1/deployments/<id>/verifications/`` queues it, the
console's job worker runs it against the real router and vLLM workers, and the report comes
back through the API; then its HTML export opens in headless Chromium with nothing fetched.

The budget is small (two input lengths, two concurrency levels, a 10 s stress run). What may
warn on this deployment and is not asserted away: no output gate result (so "no reference" for
greedy output), a random-weight model's empty chat turns, and the restarts and log lines that
earlier borrowers left (tests/borrowed.py: "clean" does not cover them). Nothing may fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from tests.borrowed import Handle
from tests.chromium import launched

pytestmark = pytest.mark.vllm

SECTIONS = ["connectivity", "function", "performance", "stress", "logs", "resources"]
BUDGET_S = 150
# The report's own budget, the job worker picking it up, and the last section's write.
WAIT_S = BUDGET_S + 120


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched() as launched_browser:
        yield launched_browser


def _wait_done(borrowed: Handle, report_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    body: dict[str, Any] = {}
    seen: list[str] = []
    while time.monotonic() < deadline:
        response = borrowed.call("GET", f"/api/v1/verifications/{report_id}/")
        assert response.status_code == 200, response.text
        body = response.json()
        seen = [s["name"] for s in body["sections"]]
        if body["state"] in ("done", "error"):
            return body
        time.sleep(2)
    raise AssertionError(f"verification #{report_id} not done after {WAIT_S} s: {body['state']}, "
                         f"sections {seen}, progress {body.get('progress')}")


def test_a_short_verification_of_the_borrowed_deployment_passes_and_exports(
        borrowed: Handle, browser: Browser, tmp_path: Path) -> None:
    queued = borrowed.call("POST", f"/api/v1/deployments/{borrowed.deployment_id}/verifications/",
                           json={"budget_s": BUDGET_S, "stress_s": 10, "lengths": 2,
                                 "concurrencies": 2})
    assert queued.status_code == 202, queued.text
    report_id = queued.json()["id"]
    started = time.monotonic()
    report = _wait_done(borrowed, report_id)
    took = time.monotonic() - started

    assert report["state"] == "done", report["error"]
    assert [s["name"] for s in report["sections"]] == SECTIONS
    failing = {s["name"]: [c["detail"] for c in s["checks"] if c["verdict"] == "fail"]
               for s in report["sections"] if s["verdict"] == "fail"}
    assert not failing, failing
    assert report["passing"] and report["verdict"] in ("pass", "warn")
    assert took < WAIT_S and report["seconds"] <= BUDGET_S + 30, report["seconds"]

    verdicts = {s["name"]: s for s in report["sections"]}
    assert verdicts["connectivity"]["verdict"] == "pass", verdicts["connectivity"]["summary"]
    pair = next(c for c in verdicts["connectivity"]["checks"] if c["name"] == "every pair served")
    assert len(pair["evidence"]["served"]) >= 1, pair
    points = [p for p in verdicts["performance"]["numbers"]["points"] if "skipped" not in p]
    assert points, verdicts["performance"]
    for point in points:
        assert point["failed"] == 0, point
        assert point["ttft_ms_p50"] > 0 and point["e2el_ms_p50"] >= point["ttft_ms_p50"], point
        assert point["output_throughput"] > 0, point
    stress = verdicts["stress"]["numbers"]
    assert stress["completed"] > 0 and stress["failed"] == 0 and stress["restarts"] == {}, stress

    export = borrowed.call("GET", f"/api/v1/verifications/{report_id}/export.html")
    assert export.status_code == 200, export.text
    assert export.headers["content-type"].startswith("text/html")
    page_file = tmp_path / "report.html"
    page_file.write_bytes(export.content)
    page = browser.new_page()
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(page_file.as_uri())
    assert fetched == [page_file.as_uri()], f"the export fetched more than itself: {fetched}"
    assert page.locator("svg polyline").count() >= 1
    assert page.locator("#section-performance").is_visible()
    page.close()
