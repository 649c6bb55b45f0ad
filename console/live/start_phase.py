"""Where a worker is in its start, read from vLLM's own log lines.

A vLLM start on a busy CPU takes minutes, most of it in phases that log: loading weights,
compiling, warming up. The phase of a starting worker is the one its newest such line opens,
since its last start header; the rollout page, the deployment page and `make up` show it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from console.live.models import LogLine
from console.supervisor.models import ManagedProcess
from console.supervisor.worker_keys import SERVER_KINDS

STARTING, LOADING, COMPILING, WARMING, READY = (
    "starting", "loading weights", "compiling", "warming up", "ready")
PHASES = (STARTING, LOADING, COMPILING, WARMING, READY)
# vLLM 0.32's lines that open each phase (CPU and CUDA), first match wins; the supervisor's own
# header opens a (re)start.
MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^=== pdserve \S+ starting "), STARTING),
    (re.compile(r"Starting to load model|Loading (safetensors|pt) checkpoint shards|"
                r"Loading weights took|Model loading took"), LOADING),
    (re.compile(r"Warming up model for the compilation|Compiling (model|a graph)|"
                r"torch\.compile|Dynamo bytecode transform|AOT compiled function|"
                r"compile range|Directly load the compiled graph"), COMPILING),
    (re.compile(r"Warming up done|Initial profiling/warmup run|KV cache size|"
                r"Capturing CUDA graphs|Graph capturing finished|init engine \(profile|"
                r"Starting vLLM server|Application startup complete"), WARMING),
)
# Lines looked at, newest first, for a starting worker's phase: a start logs a few hundred.
SCAN_LINES = 2000


def phase_of(text: str) -> str | None:
    """The phase a log line opens, or None."""
    for pattern, phase in MARKERS:
        if pattern.search(text):
            return phase
    return None


def current_phases(processes: Iterable[ManagedProcess]) -> dict[int, str]:
    """{process id: phase} of the vLLM servers among ``processes`` that are starting (a ready
    one is ready; a router or a builder logs no such phases)."""
    phases: dict[int, str] = {}
    for process in processes:
        if process.state != ManagedProcess.State.STARTING or process.kind not in SERVER_KINDS:
            continue
        phases[process.pk] = STARTING
        newest_first = LogLine.objects.filter(process=process).order_by("-seq").values_list(
            "text", flat=True)[:SCAN_LINES]
        for text in newest_first:
            phase = phase_of(text)
            if phase is not None:
                phases[process.pk] = phase
                break
    return phases
