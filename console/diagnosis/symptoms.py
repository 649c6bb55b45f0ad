"""The eight symptoms of the seeds (000's five, 003's three) and what the view answers for each:
a state, the evidence, the likely causes ranked, each with the fix and where it is applied.

Each family of symptoms has one module of rules (reachability, kv_transfer, memory_at_start,
divergence, latency, restarts), a pure function of the gathered observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from console.alerts import symptom_links as ids
from console.diagnosis.observations import AlertFact, CheckFact, LogHit


class State(StrEnum):
    NOT_SEEN = "not_seen"
    SUSPECTED = "suspected"
    PRESENT = "present"


# For the schema (settings' ENUM_NAME_OVERRIDES names them SymptomStateEnum and
# EvidenceSourceEnum).
STATE_CHOICES = [(state.value, state.value.replace("_", " ")) for state in State]
SOURCE_CHOICES = [(source, source) for source in
                  ("metrics", "log", "check", "alert", "process", "gate", "plan")]


TITLES: dict[str, str] = {
    ids.BACKEND_UNREACHABLE: "The router cannot reach a backend",
    ids.KV_TRANSFER_TIMEOUT: "Prefill to decode KV transfer times out or fails",
    ids.OOM_AT_START: "Out of memory at start",
    ids.OUTPUT_DIFFERS: "Output differs from a single-process deployment",
    ids.QUEUEING: "Heavy queueing at high concurrency",
    ids.TTFT_HIGH: "Time to first token too long",
    ids.STALLS: "Generation stutters or stalls",
    ids.RESTARTS: "Workers restart often",
}
ORDER = tuple(TITLES)


@dataclass(frozen=True)
class Evidence:
    """One observation: what was seen, where (metrics, log, check, alert, process, gate), when,
    and the page that shows it."""

    text: str
    source: str
    at: datetime | None = None
    url: str = ""
    # Present-grade evidence proves the symptom; the rest only makes it suspected.
    strong: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source,
                "at": self.at.isoformat() if self.at else None, "url": self.url,
                "strong": self.strong}


@dataclass(frozen=True)
class Fix:
    """What to change, and where: a plan field (``plan:<field>``) or a page's action
    (``page:<name>``), resolved to a link by the service."""

    text: str
    target: str
    url: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"text": self.text, "target": self.target, "url": self.url}


@dataclass(frozen=True)
class Cause:
    id: str
    text: str
    score: float  # how much of the evidence points at it; causes are ranked by it
    fixes: tuple[Fix, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "score": round(self.score, 2),
                "fixes": [f.as_dict() for f in self.fixes]}


@dataclass(frozen=True)
class Diagnosis:
    id: str
    state: State
    evidence: tuple[Evidence, ...] = ()
    causes: tuple[Cause, ...] = ()

    @property
    def title(self) -> str:
        return TITLES[self.id]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "state": str(self.state),
                "evidence": [e.as_dict() for e in self.evidence],
                "causes": [c.as_dict() for c in self.causes]}


def judge(symptom: str, evidence: list[Evidence], causes: list[Cause]) -> Diagnosis:
    """The state follows from the evidence: any strong item makes the symptom present, any
    other item suspected. Causes without any score are not listed; the rest rank by score."""
    if any(e.strong for e in evidence):
        state = State.PRESENT
    elif evidence:
        state = State.SUSPECTED
    else:
        state = State.NOT_SEEN
    ranked = sorted((c for c in causes if c.score > 0), key=lambda c: -c.score)
    if state == State.NOT_SEEN:
        ranked = []
    return Diagnosis(symptom, state, tuple(evidence), tuple(ranked))


def log_evidence(hit: LogHit, strong: bool = True) -> Evidence:
    return Evidence(f"{hit.slot}: {hit.text.strip()[:300]}", "log", hit.at, hit.url, strong)


def check_evidence(check: CheckFact, corroborated: bool = False) -> Evidence:
    """A pre-flight finding says what may go wrong; it proves the symptom only when it is an
    error and a worker is failing meanwhile (``corroborated``)."""
    return Evidence(f"check {check.id} ({check.severity}): {check.message}", "check",
                    strong=corroborated and check.severity == "error")


def alert_evidence(alert: AlertFact) -> Evidence:
    return Evidence(f"alert {alert.name} firing: {alert.summary}", "alert", alert.since,
                    alert.url, strong=True)
