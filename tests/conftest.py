"""Shared by every suite: each suite's wall time at the end of a run (tests/suite_times.py)."""

pytest_plugins = ["tests.suite_times"]
