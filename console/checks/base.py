"""What a check is and what it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from console.checks.plan import PlanView


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Result:
    """One problem: what is wrong, with both sides' values, and how to fix it."""

    id: str
    severity: Severity
    message: str
    hint: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "severity": str(self.severity), "message": self.message,
                "hint": self.hint}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    message: str
    hint: str


def error(message: str, hint: str) -> Finding:
    return Finding(Severity.ERROR, message, hint)


def warning(message: str, hint: str) -> Finding:
    return Finding(Severity.WARNING, message, hint)


@dataclass(frozen=True)
class Verdict:
    """A check function's answer: its findings, and what it compared when all is well."""

    findings: list[Finding] = field(default_factory=list)
    summary: str = ""
    # Nothing could be compared (e.g. a variant was never inspected); another check says why.
    skipped: bool = False


@dataclass(frozen=True)
class Outcome:
    id: str
    title: str
    results: tuple[Result, ...]
    summary: str
    skipped: bool

    @property
    def status(self) -> str:
        """error, warning, skipped or pass: the colour of the check's row."""
        severities = {r.severity for r in self.results}
        if Severity.ERROR in severities:
            return "error"
        if Severity.WARNING in severities:
            return "warning"
        return "skipped" if self.skipped else "pass"

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "title": self.title, "status": self.status,
                "summary": self.summary, "results": [r.as_dict() for r in self.results]}


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    function: Callable[[PlanView], Verdict]

    def __call__(self, plan: PlanView) -> Outcome:
        verdict = self.function(plan)
        results = tuple(Result(self.id, f.severity, f.message, f.hint) for f in verdict.findings)
        return Outcome(self.id, self.title, results, verdict.summary, verdict.skipped)


def check(check_id: str, title: str) -> Callable[[Callable[[PlanView], Verdict]], Check]:
    def wrap(function: Callable[[PlanView], Verdict]) -> Check:
        return Check(check_id, title, function)
    return wrap
