"""What a schemathesis run did, read from its NDJSON report: every request it sent and the status
it got, per operation, and each server error with the request that caused it."""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Operation:
    cases: int = 0
    rejected: int = 0  # answered 4xx
    server_errors: int = 0

    @property
    def accepted(self) -> int:
        return self.cases - self.rejected - self.server_errors


@dataclass
class RunReport:
    command: str = ""
    seed: int | None = None
    operations: dict[str, Operation] = field(default_factory=dict)
    phases: Counter[str] = field(default_factory=Counter)
    failed_checks: Counter[str] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    @property
    def cases(self) -> int:
        return sum(op.cases for op in self.operations.values())

    @property
    def rejected(self) -> int:
        return sum(op.rejected for op in self.operations.values())

    def table(self, known: set[str]) -> str:
        """One row per operation of the schema; the requests with methods it does not list
        (the coverage phase tries them: each must be refused) summed in one row."""
        rows = [f"{'operation':<48} {'cases':>6} {'4xx':>6}  share  5xx"]
        other = Operation()
        for label, op in sorted(self.operations.items(), key=lambda item: item[0].split(" ")[::-1]):
            if label not in known:
                other.cases += op.cases
                other.rejected += op.rejected
                other.server_errors += op.server_errors
                continue
            rows.append(_row(label, op))
        if other.cases:
            rows.append(_row("(methods the schema does not list)", other))
        return "\n".join(rows)


def _row(label: str, op: Operation) -> str:
    return f"{label:<48} {op.cases:>6} {op.rejected:>6} {op.rejected / op.cases:>6.0%} {op.server_errors:>4}"


def read_report(path: Path) -> RunReport:
    report = RunReport()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if "Initialize" in event:
            report.command = event["Initialize"]["command"]
            report.seed = event["Initialize"]["seed"]
        elif "ScenarioFinished" in event:
            _scenario(report, event["ScenarioFinished"])
    return report


def _scenario(report: RunReport, scenario: dict[str, Any]) -> None:
    recorder = scenario["recorder"]
    for case_id, interaction in recorder.get("interactions", {}).items():
        request, response = interaction["request"], interaction["response"]
        if response is None:  # the request failed at the network level: a check reports it
            continue
        label = _label(recorder, case_id, request)
        op = report.operations.setdefault(label, Operation())
        op.cases += 1
        report.phases[scenario["phase"]] += 1
        code = int(response["status_code"])
        if 400 <= code < 500:
            op.rejected += 1
        elif code >= 500:
            op.server_errors += 1
            report.server_errors.append(
                f"{label} -> {code}: {request['uri']} {_text(request.get('body'))[:300]!r}\n"
                f"  answer: {_text(response.get('content'))[:300]!r}")
    for results in recorder.get("checks", {}).values():
        for check in results:
            if check["status"] == "failure":
                report.failed_checks[check["name"]] += 1


def _label(recorder: dict[str, Any], case_id: str, request: dict[str, Any]) -> str:
    # A stateful scenario records several operations: each case names its own (path template).
    case = recorder.get("cases", {}).get(case_id, {}).get("value")
    if case is None:
        return f"{request['method']} {request['uri']}"
    return f"{case['method']} {case['path']}"


def _text(body: dict[str, str] | None) -> str:
    if not body:
        return ""
    if "$base64" in body:
        return base64.b64decode(body["$base64"]).decode(errors="replace")
    return str(body.get("string", ""))
