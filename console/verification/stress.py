"""Stress: the plan's concurrency held for a set time: requests that failed, were dropped
mid-stream or timed out; the workers' memory trend; restarts during the run."""

from __future__ import annotations

import asyncio
from typing import Any

from django.utils import timezone

from console.supervisor.models import ManagedProcess
from console.verification.footprint import GIB, samples_since, series
from console.verification.streaming import completion_body, filler_prompt, hold, summarise
from console.verification.subject import Subject
from console.verification.verdicts import FAIL, PASS, WARN, Section
from inference.worker_auth import bearer

# How long the plan's concurrency is held unless asked otherwise.
DEFAULT_HOLD_S = 30
INPUT_WORDS = 64
OUTPUT_TOKENS = 32
REQUEST_TIMEOUT_S = 60.0
# Memory that grows this much over a short run at steady load is worth a look (a leak, or
# a cache still filling).
RSS_GROWTH_WARN = 0.2


def _restarts(deployment_id: int) -> dict[str, int]:
    return dict(ManagedProcess.objects.filter(deployment_id=deployment_id)
                .values_list("slot", "restarts"))


def stress(subject: Subject, seconds: float, seed: int) -> Section:
    section = Section("stress")
    before = _restarts(subject.deployment_id)
    started = timezone.now()

    def body(n: int) -> dict[str, Any]:
        return completion_body(subject.model, filler_prompt(INPUT_WORDS, seed + n), OUTPUT_TOKENS)

    outcomes, duration = asyncio.run(hold(f"{subject.router_url}/v1/completions",
                                          bearer(subject.api_key), body,
                                          max(1, subject.concurrency), seconds, REQUEST_TIMEOUT_S))
    numbers = summarise(outcomes, duration)
    dropped = sum(1 for o in outcomes if o.error and not o.timeout
                  and not o.error.startswith("HTTP "))
    numbers.update(concurrency=subject.concurrency, held_s=seconds, dropped=dropped)
    after = _restarts(subject.deployment_id)
    restarted = {slot: after[slot] - before.get(slot, 0) for slot in after
                 if after[slot] > before.get(slot, 0)}
    samples = samples_since(subject.deployment_id, started)
    trend: dict[str, Any] = {}
    for worker in subject.workers:
        rss = series(samples, worker.slot, "rss")
        if len(rss) >= 2 and rss[0] > 0:
            trend[worker.slot] = {"first_gib": round(rss[0] / GIB, 3),
                                  "last_gib": round(rss[-1] / GIB, 3),
                                  "growth": round(rss[-1] / rss[0] - 1, 3)}
    numbers.update(restarts=restarted, memory_trend=trend)
    section.numbers = numbers
    if not numbers["completed"]:
        section.add("requests", FAIL, f"none of {numbers['requests']} requests completed",
                    errors=numbers.get("errors", []))
    else:
        section.add("requests", FAIL if numbers["failed"] else PASS,
                    f"{numbers['failed']} of {numbers['requests']} requests failed at "
                    f"concurrency {subject.concurrency} for {seconds:.0f} s ({numbers['timeouts']} "
                    f"timed out, {dropped} dropped)", errors=numbers.get("errors", []))
    section.add("restarts", FAIL if restarted else PASS,
                f"restarted during the run: {restarted}" if restarted
                else "no process restarted during the run", restarts=restarted)
    growing = {slot: t for slot, t in trend.items() if t["growth"] > RSS_GROWTH_WARN}
    if not samples:
        section.add("memory trend", WARN, "no metric samples during the run: memory unknown")
    else:
        section.add("memory trend", WARN if growing else PASS,
                    f"memory grew over {RSS_GROWTH_WARN:.0%} on {', '.join(growing)}" if growing
                    else "memory steady during the run", trend=trend)
    return section
