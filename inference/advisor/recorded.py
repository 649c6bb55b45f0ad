"""A load profile from what the router recorded: its per-request timelines.

The router logs one ``timeline {...}`` line per finished request (inference/router/timeline.py)
with the wall-clock arrival (``start``), ``prompt_tokens``, ``completion_tokens`` and ``status``;
the console keeps these lines in its log store. The router's admin API does not serve them, so
the advisor reads the lines (a log file, or what the console hands it).

From them: the arrival rate (requests over the recorded span) and the empirical prompt and
output lengths, as one Poisson stream; each seed then redraws arrivals and resamples the
lengths. Missing from the records, and so from the profile: requests refused before a prompt
was tokenized (no lengths), the ``max_tokens`` asked for (only what was generated), whether
prompt and answer lengths go together (each is resampled on its own), and bursts (the rate is
one average over the span).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from inference.advisor.errors import InputError
from inference.advisor.fields import integer, number
from inference.advisor.load import Lengths, LoadProfile, Stream

PREFIX = "timeline "


def timeline_records(lines: Iterable[str], where: str) -> list[dict[str, Any]]:
    """The timeline objects among log lines (other lines are skipped: a router log holds more)."""
    records = []
    for line_number, line in enumerate(lines, 1):
        at = line.find(PREFIX + "{")
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(PREFIX):])
        except json.JSONDecodeError as exc:
            raise InputError(where, f"line {line_number}: a timeline that is not JSON: {exc}") from exc
        records.append(record)
    return records


@dataclass(frozen=True)
class Recorded:
    profile: LoadProfile
    used: int
    skipped: int  # failed, or without token counts


def profile_from_timelines(records: Iterable[dict[str, Any]], where: str) -> Recorded:
    starts: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    skipped = 0
    for i, record in enumerate(records):
        prompt, output = record.get("prompt_tokens"), record.get("completion_tokens")
        if record.get("status") != 200 or not prompt or not output or "start" not in record:
            skipped += 1
            continue
        starts.append(number(record["start"], f"{where}: timeline {i + 1}.start"))
        prompts.append(integer(prompt, f"{where}: timeline {i + 1}.prompt_tokens", minimum=1))
        outputs.append(integer(output, f"{where}: timeline {i + 1}.completion_tokens", minimum=1))
    if len(starts) < 2:
        raise InputError(where, f"{len(starts)} usable request timelines (successful, with token "
                                "counts); at least two are needed for an arrival rate")
    span = max(starts) - min(starts)
    if span <= 0:
        raise InputError(where, "every usable request arrived at the same instant: no rate")
    # n arrivals span n - 1 gaps.
    stream = Stream(name="recorded", rate_per_s=(len(starts) - 1) / span, requests=len(starts),
                    prompt_tokens=Lengths(tuple(prompts)), output_tokens=Lengths(tuple(outputs)))
    return Recorded(LoadProfile((stream,)), used=len(starts), skipped=skipped)
