"""The calibration text that ships with pdserve (``inference/calibration/samples.txt``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_FILE = Path(__file__).resolve().parent.parent / "calibration" / "samples.txt"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Sample:
    kind: str
    text: str  # for "chat": the raw text; messages() parses it

    def messages(self) -> list[dict[str, str]]:
        messages: list[dict[str, str]] = []
        for line in self.text.splitlines():
            role, sep, rest = line.partition(":")
            if sep and role in ROLES:
                messages.append({"role": role, "content": rest.strip()})
            elif messages:
                messages[-1]["content"] += "\n" + line
            else:
                raise ValueError(f"chat sample starts without a role: {line!r}")
        return messages


def read_samples(path: Path = DEFAULT_FILE) -> list[Sample]:
    """Samples in file order; each starts at a line ``=== <kind>``."""
    samples: list[Sample] = []
    kind: str | None = None
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("=== "):
            if kind is not None:
                samples.append(Sample(kind, "\n".join(lines).strip()))
            kind, lines = line[4:].strip(), []
        elif kind is not None:
            lines.append(line)
    if kind is not None:
        samples.append(Sample(kind, "\n".join(lines).strip()))
    return [sample for sample in samples if sample.text]


def pick(samples: list[Sample], count: int) -> list[Sample]:
    """``count`` samples taken from each kind in turn, so a small count still mixes them."""
    by_kind: dict[str, list[Sample]] = {}
    for sample in samples:
        by_kind.setdefault(sample.kind, []).append(sample)
    picked: list[Sample] = []
    queues = [list(reversed(group)) for group in by_kind.values()]
    while len(picked) < count and any(queues):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop())
    return picked
