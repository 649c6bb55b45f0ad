"""``manage.py doctor <deployment>``: the troubleshooting view in a shell. It exits 1 when a
symptom is present, so that a script or a CI step can stop on it."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.deployments.command_args import named_deployment
from console.diagnosis import services

MARKS = {"present": "PRESENT", "suspected": "suspected", "not_seen": "not seen"}


class Command(BaseCommand):
    help = "Evaluate a deployment's eight symptoms now: state, evidence, likely causes and fixes."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("deployment", help="the deployment's name (or id)")
        parser.add_argument("--json", action="store_true", help="print the API's JSON instead")

    def handle(self, *args: Any, **options: Any) -> None:
        deployment = named_deployment(options["deployment"])
        report = services.report(deployment)
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write("\n".join(render(report)))
        present = [s["id"] for s in report["symptoms"] if s["state"] == "present"]
        if present:
            raise CommandError(f"{deployment.name}: present: {', '.join(present)}", returncode=1)


def render(report: dict[str, Any]) -> list[str]:
    """The report as text: a line per symptom, then its evidence, causes and fixes indented."""
    lines = [f"{report['name']}: {MARKS[report['state']]} (evaluated {report['evaluated_at']})"]
    for symptom in report["symptoms"]:
        lines.append(f"[{MARKS[symptom['state']]:>9}] {symptom['title']} (#{symptom['id']})")
        for item in symptom["evidence"]:
            when = f" {item['at'][11:19]}" if item["at"] else ""
            link = f" <{item['url']}>" if item["url"] else ""
            lines.append(f"    - {item['source']}{when}: {item['text']}{link}")
        for rank, cause in enumerate(symptom["causes"], 1):
            lines.append(f"    {rank}. {cause['text']}")
            for fix in cause["fixes"]:
                where = fix["url"] or fix["target"]
                lines.append(f"       fix: {fix['text']} [{where}]")
    return lines
