"""When a slow ``/health`` probe means a worker is down: one rule for the router's probes
(inference/router/backends.py) and the supervisor's (console/supervisor/health_probe.py).

A busy worker answers its probe late: on two loaded cores (load average 24-30) one probe of a
healthy decode timed out and the console showed it "starting (health check failing)" for 2 s.
So the probe's patience follows the worker's measured load, its recent probe latencies: the
timeout is a few times the slowest recent answer (never below the base, never above a cap), and
a worker that has been answering slowly needs one slow probe more before it is out. A dead
process is no such doubt: its connection is refused (or its pid is gone), and that takes it out
at once, whatever its load.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# The timeout is this many times the slowest of the recent answers.
LATENCY_FACTOR = 3.0
# Recent answers: at one probe a second (the router), the last ~10 s.
RECENT = 10
# Slow probes in a row that take a worker out: an idle one, and one whose recent answers took
# more than BUSY_SHARE of the base timeout (it is loaded; one late answer is expected).
SLOW_PROBES_TO_FAIL = 2
SLOW_PROBES_TO_FAIL_BUSY = 3
BUSY_SHARE = 0.25


@dataclass
class ProbeRule:
    """One worker's probe history and what it makes of the next probe."""

    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    slow: int = 0  # slow (timed-out) probes in a row

    def timeout_s(self, base_s: float, cap_s: float) -> float:
        """How long the next probe waits: ``base_s``, or longer for a worker whose recent
        answers were slow, up to ``cap_s``."""
        recent = max(self.latencies, default=0.0)
        return min(cap_s, max(base_s, LATENCY_FACTOR * recent))

    def busy(self, base_s: float) -> bool:
        return max(self.latencies, default=0.0) > BUSY_SHARE * base_s

    def answered(self, latency_s: float) -> None:
        self.latencies.append(latency_s)
        self.slow = 0

    def timed_out(self, base_s: float) -> bool:
        """Count a probe that ran out of time; True when that makes the worker down."""
        self.slow += 1
        needed = SLOW_PROBES_TO_FAIL_BUSY if self.busy(base_s) else SLOW_PROBES_TO_FAIL
        return self.slow >= needed

    def refused(self) -> None:
        """The worker is not there (connection refused or reset): down at once; its history
        says nothing about the process that may come back."""
        self.latencies.clear()
        self.slow = 0
