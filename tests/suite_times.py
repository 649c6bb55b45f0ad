"""A pytest plugin: at the end of a run, each suite's wall time and the sum of its tests' durations.

A suite is a directory right under ``tests/`` (unit, console, e2e, ...); the files directly in
``tests/`` make one more. Wall time runs from the first setup to the last teardown of the suite's
tests, so a session fixture a suite starts (a vLLM server) counts in the suite that started it.
The slowest tests themselves come from pytest's ``--durations`` (pyproject.toml's addopts).
Each suite's row also counts the vLLM servers started while its tests ran and the seconds they
took to start (tests/vllm_starts.py), which is where most of a run's time goes. A second table
names the files that cost most: each test file's summed durations and the servers started under
its tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from tests.vllm_starts import Server, ServerWatch

ROOT_FILES = "(tests/*.py)"
COSTLIEST = 15


def suite_of(nodeid: str) -> str:
    """``tests/e2e/test_x.py::test_y`` -> ``e2e``; ``tests/test_z.py::t`` -> the root files."""
    parts = nodeid.split("::", 1)[0].split("/")
    if "tests" in parts:
        parts = parts[parts.index("tests") + 1:]
    return parts[0] if len(parts) > 1 else ROOT_FILES


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@dataclass
class SuiteTime:
    tests: set[str] = field(default_factory=set)
    first_start: float = math.inf
    last_stop: float = 0.0
    summed: float = 0.0
    servers: list[Server] = field(default_factory=list)

    @property
    def start_seconds(self) -> float:
        return sum(server.start_seconds or 0.0 for server in self.servers)

    @property
    def wall(self) -> float:
        return max(0.0, self.last_stop - self.first_start)


class SuiteTimes:
    def __init__(self, watch: ServerWatch | None = None) -> None:
        self.suites: dict[str, SuiteTime] = {}
        self.files: dict[str, SuiteTime] = {}
        # When each phase of each test began, to find the test a server was created under.
        self.phases: list[tuple[float, str]] = []
        self.watch = watch

    def pytest_sessionstart(self) -> None:
        if self.watch is not None:
            self.watch.start()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases.append((report.start, report.nodeid))
        for group in (self.suites.setdefault(suite_of(report.nodeid), SuiteTime()),
                      self.files.setdefault(file_of(report.nodeid), SuiteTime())):
            group.tests.add(report.nodeid)
            group.first_start = min(group.first_start, report.start)
            group.last_stop = max(group.last_stop, report.stop)
            group.summed += report.duration

    @pytest.hookimpl(trylast=True)  # after --durations: the run's last lines
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.suites:
            return
        self.attribute_servers()
        ordered = sorted(self.suites.items(), key=lambda item: item[1].first_start)
        width = max(len("suite"), *(len(name) for name in self.suites))
        terminalreporter.write_sep("=", "suite wall times")
        terminalreporter.write_line(f"{'suite':<{width}}  {'tests':>5}  {'wall':>9}  {'summed':>9}"
                                    f"  {'vllm':>4}  {'starting':>9}")
        for name, suite in ordered:
            terminalreporter.write_line(f"{name:<{width}}  {len(suite.tests):>5}  "
                                        f"{suite.wall:>8.1f}s  {suite.summed:>8.1f}s  "
                                        f"{len(suite.servers):>4}  {suite.start_seconds:>8.1f}s")
        suites = self.suites.values()
        wall = max(s.last_stop for s in suites) - min(s.first_start for s in suites)
        terminalreporter.write_line(
            f"{'all':<{width}}  {sum(len(s.tests) for s in suites):>5}  "
            f"{wall:>8.1f}s  {sum(s.summed for s in suites):>8.1f}s  "
            f"{sum(len(s.servers) for s in suites):>4}  "
            f"{sum(s.start_seconds for s in suites):>8.1f}s")
        self.write_costliest_files(terminalreporter)

    def write_costliest_files(self, terminalreporter: pytest.TerminalReporter) -> None:
        costliest = sorted(self.files.items(), key=lambda item: -item[1].summed)[:COSTLIEST]
        width = max(len(name) for name, _ in costliest)
        terminalreporter.write_sep("=", f"the {len(costliest)} costliest test files")
        terminalreporter.write_line(f"{'file':<{width}}  {'tests':>5}  {'summed':>9}  {'vllm':>4}"
                                    f"  {'starting':>9}")
        for name, group in costliest:
            terminalreporter.write_line(f"{name:<{width}}  {len(group.tests):>5}  "
                                        f"{group.summed:>8.1f}s  {len(group.servers):>4}  "
                                        f"{group.start_seconds:>8.1f}s")

    def attribute_servers(self) -> None:
        """Each server goes to the suite and file of the last test phase begun before it was
        created (a session fixture starts under the first test that asks for it)."""
        if self.watch is None or not self.phases:
            return
        phases = sorted(self.phases)
        for server in self.watch.stop():
            nodeid = phases[0][1]
            for began, name in phases:
                if began > server.created:
                    break
                nodeid = name
            self.suites[suite_of(nodeid)].servers.append(server)
            self.files[file_of(nodeid)].servers.append(server)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteTimes(ServerWatch()), "pdserve-suite-times")
