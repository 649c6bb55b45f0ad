"""A section of a report: its checks, each with a verdict, and the section's worst verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"
# A check that does not apply to this deployment (an image request to a text-only model): its
# row says why, and it counts toward no verdict.
NOT_APPLICABLE = "n/a"
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
        return worst([c.verdict for c in self.checks if c.verdict != NOT_APPLICABLE])

    @property
    def summary(self) -> str:
        """The failing checks' details, else the warnings', else how many passed (and how many
        did not apply)."""
        for level in (FAIL, WARN):
            found = [c.detail for c in self.checks if c.verdict == level]
            if found:
                return "; ".join(found)
        skipped = sum(c.verdict == NOT_APPLICABLE for c in self.checks)
        return f"{len(self.checks) - skipped} checks passed" + (
            f", {skipped} not applicable" if skipped else "")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "summary": self.summary,
                "numbers": self.numbers, "seconds": round(self.seconds, 1),
                "checks": [asdict(c) for c in self.checks]}
