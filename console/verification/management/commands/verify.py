"""``manage.py verify <deployment>``: verify a running deployment here and now, printing each
section as it finishes; the exit status is 1 when a section fails (or the report could not
run), else 0."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.deployments.models import Deployment
from console.verification import services
from console.verification.execution import run_report
from console.verification.models import VerificationReport
from console.verification.sweep import SweepSize


class Command(BaseCommand):
    help = "Verify a running deployment: connectivity, function, performance, stress, logs, resources."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("deployment", help="the deployment's name")
        parser.add_argument("--budget-s", type=int, default=services.DEFAULT_BUDGET_S,
                            help="time budget of the whole report (default %(default)s)")
        parser.add_argument("--stress-s", type=int, default=services.DEFAULT_STRESS_S,
                            help="how long the stress run holds the plan's concurrency")
        parser.add_argument("--lengths", type=int, default=SweepSize.lengths,
                            help="input lengths of the sweep")
        parser.add_argument("--concurrencies", type=int, default=SweepSize.concurrencies,
                            help="concurrency levels of the sweep")
        parser.add_argument("--json", action="store_true", help="print the whole report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        deployment = Deployment.objects.filter(name=options["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment named {options['deployment']!r}")
        try:
            report = services.queue_verification(
                deployment, VerificationReport.Trigger.COMMAND, budget_s=options["budget_s"],
                run_options=services.options(options["lengths"], options["concurrencies"],
                                             options["stress_s"]), send=False)
        except services.VerificationRefused as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"verification #{report.pk} of {deployment.name} "
                          f"(revision {report.revision or '-'}, budget {report.budget_s} s)")
        report = run_report(report.pk, listener=self._section)
        self._end(report, options["json"])

    def _section(self, section: dict[str, Any]) -> None:
        self.stdout.write(f"{section['name']:<13} {section['verdict'].upper():<5} "
                          f"{section['seconds']:>6.1f} s  {section['summary']}")
        for check in section["checks"]:
            if check["verdict"] != "pass":
                self.stdout.write(f"    {check['verdict']}: {check['detail']}")
        self.stdout.flush()

    def _end(self, report: VerificationReport, as_json: bool) -> None:
        for regression in report.comparison.get("regressions", []):
            self.stdout.write(f"regression against #{report.comparison['previous']}: "
                              f"{json.dumps(regression)}")
        if as_json:
            self.stdout.write(json.dumps({"id": report.pk, "verdict": report.verdict,
                                          "sections": report.sections,
                                          "comparison": report.comparison}, indent=1))
        if report.state == VerificationReport.State.ERROR:
            raise CommandError(f"verification #{report.pk} could not run: {report.error}")
        self.stdout.write(f"verdict: {report.verdict} ({report.seconds} s)")
        if report.verdict == VerificationReport.Verdict.FAIL:
            raise CommandError(f"verification #{report.pk} failed")
