"""Logs: errors, warnings, KV transfer timeouts and retries, out-of-memory and restarts since
the deployment's processes started, per process, each line linked to its place in the log."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.urls import reverse

from console.live.models import LogLine
from console.supervisor.models import ManagedProcess
from console.verification.verdicts import FAIL, PASS, WARN, Section

# Lines kept as evidence per process and kind.
KEPT = 5
# Lines read per process, newest first: a long-running deployment has many.
READ_LIMIT = 20_000


@dataclass(frozen=True)
class Kind:
    name: str
    pattern: re.Pattern[str]
    verdict: str  # what one such line makes the section


# A line logged at these levels is advice ("... to avoid OOM"), not the event itself: it never
# counts as a failing kind, only as what it else matches.
NOT_AN_EVENT = re.compile(r"\b(?:DEBUG|INFO|WARNING)\b")

# In order: a line counts once, as the first kind it matches.
KINDS = (
    Kind("oom", re.compile(r"out of memory|OutOfMemory|\bOOM\b|Cannot allocate memory|"
                           r"MemoryError|oom-kill", re.IGNORECASE), FAIL),
    # kv_load_failure, not the flag kv_load_failure_policy of every worker's configuration
    # dump (it made every healthy PD start's report warn of "KV transfer lines").
    Kind("kv_transfer", re.compile(r"KV load fail|kv_load_failure(?!_policy)|"
                                   r"NIXL.*(?:fail|timed? ?out)|"
                                   r"(?:KV|transfer|handshake).*(?:timed out|timeout)|"
                                   r"(?:prefill|decode)_retried|retrying (?:prefill|decode)",
                                   re.IGNORECASE), WARN),
    Kind("error", re.compile(r"\bERROR\b|Traceback \(most recent call last\)|EngineDeadError|"
                             r"\bCRITICAL\b"), WARN),
    # vLLM warns about much at start; counted, not judged.
    Kind("warning", re.compile(r"\bWARNING\b"), PASS),
)


def classify(text: str) -> Kind | None:
    return next((k for k in KINDS if k.pattern.search(text)
                 and not (k.verdict == FAIL and NOT_AN_EVENT.search(text))), None)


def link(process_id: int, seq: int) -> dict[str, str]:
    return {"page": reverse("process-log", args=[process_id]) + f"#seq-{seq}",
            "lines": reverse("process-logs", args=[process_id]) + f"?after={max(0, seq - 3)}&limit=7"}


def scan(process: ManagedProcess, since: datetime | None) -> dict[str, Any]:
    lines = LogLine.objects.filter(process=process)
    if since is not None:
        lines = lines.filter(created__gte=since)
    counts = {kind.name: 0 for kind in KINDS}
    kept: dict[str, list[dict[str, Any]]] = {kind.name: [] for kind in KINDS}
    for seq, text in lines.order_by("-seq").values_list("seq", "text")[:READ_LIMIT]:
        kind = classify(text)
        if kind is None:
            continue
        counts[kind.name] += 1
        if len(kept[kind.name]) < KEPT:
            kept[kind.name].append({"seq": seq, "text": text[:300], **link(process.pk, seq)})
    return {"counts": counts, "lines": kept}


def logs(deployment_id: int) -> Section:
    section = Section("logs")
    processes = list(ManagedProcess.objects.filter(deployment_id=deployment_id)
                     .exclude(state=ManagedProcess.State.STOPPED).order_by("slot"))
    # Since the deployment's start: the earliest start among its live processes (a restarted
    # worker's own start is later, and its lines before that still count).
    starts = [p.started_at for p in processes if p.started_at is not None]
    since = min(starts, default=None)
    per_process: dict[str, Any] = {}
    for process in processes:
        found = scan(process, since)
        found["restarts"] = process.restarts
        per_process[process.slot] = found
        for kind in KINDS:
            count = found["counts"][kind.name]
            if count and kind.verdict != PASS:
                section.add(f"{process.slot} {kind.name}", kind.verdict,
                            f"{process.slot}: {count} {kind.name.replace('_', ' ')} lines",
                            process=process.pk, lines=found["lines"][kind.name])
        if process.restarts:
            section.add(f"{process.slot} restarts", WARN,
                        f"{process.slot} restarted {process.restarts} times",
                        last_error=process.last_error, process=process.pk)
    if not section.checks:
        section.add("logs", PASS, f"no errors, KV transfer failures, OOM or restarts in "
                    f"{len(processes)} processes' logs")
    section.numbers = {"since": since.isoformat() if since else None, "processes": per_process}
    return section
