"""Running a report: the sections in order within the report's time budget, each stored as it
finishes (the report page and ``manage.py verify`` show them meanwhile), then the comparison
with the deployment's previous report. A Celery task runs it for the page and the API; the
command runs it in its own process."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from console.celery import app
from console.deployments.models import Deployment
from console.verification.comparison import compare
from console.verification.connectivity import connectivity
from console.verification.footprint import latest_sample, resources, samples_since
from console.verification.function_checks import function
from console.verification.log_scan import logs
from console.verification.models import VerificationReport
from console.verification.stress import DEFAULT_HOLD_S, stress
from console.verification.subject import subject_of
from console.verification.sweep import SweepSize, performance
from console.verification.verdicts import WARN, Section, worst

log = logging.getLogger("pdserve.verification")
State = VerificationReport.State
# Kept for the last sections (logs, resources) and the stress run's last requests.
RESERVE_S = 15.0
SECTIONS = ("connectivity", "function", "performance", "stress", "logs", "resources")

Listener = Callable[[dict[str, Any]], None]


@app.task(name="verification.run", ignore_result=True)
def run_verification(report_id: int) -> None:
    run_report(report_id)


def _progress(report_id: int, section: str, message: str) -> None:
    VerificationReport.objects.filter(pk=report_id).update(
        progress={"section": section, "message": message, "done": SECTIONS.index(section),
                  "total": len(SECTIONS)})


def run_report(report_id: int, listener: Listener | None = None) -> VerificationReport:
    """Run the report's sections; ``listener`` gets each section (as stored) when it ends."""
    report = VerificationReport.objects.select_related("deployment").get(pk=report_id)
    VerificationReport.objects.filter(pk=report_id).update(state=State.RUNNING,
                                                           started_at=timezone.now())
    try:
        sections = _sections(report, listener)
        fields = _finish(report, sections)
    except Exception as exc:  # the row must not stay "running", whatever happened
        log.exception("verification #%d crashed", report_id)
        fields = {"state": State.ERROR, "error": f"the verification crashed: {exc!r}"[:1000]}
    VerificationReport.objects.filter(pk=report_id).update(finished_at=timezone.now(),
                                                           progress={}, **fields)
    report.refresh_from_db()
    return report


def _sections(report: VerificationReport, listener: Listener | None) -> list[dict[str, Any]]:
    deployment: Deployment = report.deployment
    options = report.options
    green = report.trigger == VerificationReport.Trigger.GREEN
    subject = subject_of(deployment, report.revision if green else None,
                         options.get("green_side_channels") if green else None)
    size = SweepSize(lengths=int(options.get("lengths", SweepSize.lengths)),
                     concurrencies=int(options.get("concurrencies", SweepSize.concurrencies)))
    stress_s = float(options.get("stress_s", DEFAULT_HOLD_S))
    start = time.monotonic()
    budget_end = start + report.budget_s
    seed = report.pk * 1_000_000
    stored: list[dict[str, Any]] = []

    def run(name: str, message: str, work: Callable[[], Section]) -> Section:
        _progress(report.pk, name, message)
        began = time.monotonic()
        section = work()
        section.seconds = time.monotonic() - began
        stored.append(section.as_dict())
        VerificationReport.objects.filter(pk=report.pk).update(sections=stored)
        if listener is not None:
            listener(stored[-1])
        return section

    run("connectivity", "ports, health, models, the router's view, each pair",
        lambda: connectivity(deployment, subject, report.pk))
    run("function", "a completion, a streamed dialogue, greedy output, an image request",
        lambda: function(deployment, subject))
    idle = latest_sample(deployment.pk)
    loaded_since = timezone.now()
    stress_s = max(0.0, min(stress_s, budget_end - time.monotonic() - RESERVE_S))
    sweep_end = budget_end - stress_s - RESERVE_S
    run("performance", "the sweep over input length x concurrency",
        lambda: performance(subject, size, sweep_end, seed))
    run("stress", f"the plan's concurrency held for {stress_s:.0f} s",
        lambda: stress(subject, stress_s, seed + 500_000))
    run("logs", "errors, KV transfer trouble, OOM, restarts", lambda: logs(deployment.pk))
    run("resources", "memory against the nodes', KV cache usage",
        lambda: resources(subject, idle, samples_since(deployment.pk, loaded_since)))
    return stored


def _finish(report: VerificationReport, sections: list[dict[str, Any]]) -> dict[str, Any]:
    previous = (VerificationReport.objects.filter(deployment=report.deployment_id,
                                                  state=State.DONE, pk__lt=report.pk)
                .order_by("-pk").first())
    comparison: dict[str, Any] = {}
    verdict = worst([s["verdict"] for s in sections])
    if previous is not None:
        regressions = compare(sections, previous.sections)
        comparison = {"previous": previous.pk, "previous_revision": previous.revision,
                      "regressions": regressions}
        if regressions:
            verdict = worst([verdict, WARN])
    return {"state": State.DONE, "verdict": verdict, "comparison": comparison}
