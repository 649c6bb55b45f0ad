"""A section of a report: its checks, each with a verdict, and the section's worst verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"
RANK = {PASS: 0, WARN: 1, FAIL: 2}


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=RANK.__getitem__, default=PASS)


@dataclass
class Check:
    """One finding: what was looked at, its verdict and what shows it (numbers, lines, links)."""

    name: str
    verdict: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Section:
    name: str
    checks: list[Check] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, name: str, verdict: str, detail: str, **evidence: Any) -> Check:
        check = Check(name, verdict, detail, evidence)
        self.checks.append(check)
        return check

    @property
    def verdict(self) -> str:
        return worst([c.verdict for c in self.checks])

    @property
    def summary(self) -> str:
        """The failing checks' details, else the warnings', else how many passed."""
        for level in (FAIL, WARN):
            found = [c.detail for c in self.checks if c.verdict == level]
            if found:
                return "; ".join(found)
        return f"{len(self.checks)} checks passed"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "summary": self.summary,
                "numbers": self.numbers, "seconds": round(self.seconds, 1),
                "checks": [asdict(c) for c in self.checks]}
