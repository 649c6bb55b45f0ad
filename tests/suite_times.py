"""A pytest plugin: at the end of a run, each suite's wall time and the sum of its tests' durations.

A suite is a directory right under ``tests/`` (unit, console, e2e, ...); the files directly in
``tests/`` make one more. Wall time runs from the first setup to the last teardown of the suite's
tests, so a session fixture a suite starts (a vLLM server) counts in the suite that started it.
The slowest tests themselves come from pytest's ``--durations`` (pyproject.toml's addopts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

ROOT_FILES = "(tests/*.py)"


def suite_of(nodeid: str) -> str:
    """``tests/e2e/test_x.py::test_y`` -> ``e2e``; ``tests/test_z.py::t`` -> the root files."""
    parts = nodeid.split("::", 1)[0].split("/")
    if "tests" in parts:
        parts = parts[parts.index("tests") + 1:]
    return parts[0] if len(parts) > 1 else ROOT_FILES


@dataclass
class SuiteTime:
    tests: set[str] = field(default_factory=set)
    first_start: float = math.inf
    last_stop: float = 0.0
    summed: float = 0.0

    @property
    def wall(self) -> float:
        return max(0.0, self.last_stop - self.first_start)


class SuiteTimes:
    def __init__(self) -> None:
        self.suites: dict[str, SuiteTime] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        suite = self.suites.setdefault(suite_of(report.nodeid), SuiteTime())
        suite.tests.add(report.nodeid)
        suite.first_start = min(suite.first_start, report.start)
        suite.last_stop = max(suite.last_stop, report.stop)
        suite.summed += report.duration

    @pytest.hookimpl(trylast=True)  # after --durations: the run's last lines
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.suites:
            return
        ordered = sorted(self.suites.items(), key=lambda item: item[1].first_start)
        width = max(len("suite"), *(len(name) for name in self.suites))
        terminalreporter.write_sep("=", "suite wall times")
        terminalreporter.write_line(f"{'suite':<{width}}  {'tests':>5}  {'wall':>9}  {'summed':>9}")
        for name, suite in ordered:
            terminalreporter.write_line(f"{name:<{width}}  {len(suite.tests):>5}  "
                                        f"{suite.wall:>8.1f}s  {suite.summed:>8.1f}s")
        wall = max(s.last_stop for s in self.suites.values()) - min(
            s.first_start for s in self.suites.values())
        terminalreporter.write_line(
            f"{'all':<{width}}  {sum(len(s.tests) for s in self.suites.values()):>5}  "
            f"{wall:>8.1f}s  {sum(s.summed for s in self.suites.values()):>8.1f}s")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteTimes(), "pdserve-suite-times")
