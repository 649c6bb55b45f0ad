"""The suite timing plugin: every suite of a run, with its wall time, in the closing summary."""

from __future__ import annotations

import re

import pytest

from tests.suite_times import ROOT_FILES, suite_of

pytest_plugins = ["pytester"]


def test_suite_of_names_the_directory_under_tests() -> None:
    assert suite_of("tests/e2e/test_nixl.py::test_x") == "e2e"
    assert suite_of("tests/console/sub/test_y.py::T::test_z[1]") == "console"
    assert suite_of("tests/test_layering.py::test_a") == ROOT_FILES
    assert suite_of("elsewhere/test_b.py::test_c") == "elsewhere"


def test_the_summary_lists_each_suite_with_its_wall_time(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**{
        "tests/unit/test_fast.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
        "tests/e2e/test_slow.py": (
            "import time\nimport pytest\n\n"
            "@pytest.fixture(scope='module')\ndef started():\n    time.sleep(0.3)\n    yield\n"
            "    time.sleep(0.2)\n\n"
            "def test_uses_it(started):\n    time.sleep(0.1)\n"),
        "tests/test_root.py": "def test_root():\n    pass\n",
    })
    # In process, without the plugins this project configures for its own run.
    result = pytester.runpytest("-p", "tests.suite_times", "-p", "no:cacheprovider",
                                "-p", "no:django", "-p", "no:asyncio")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*= suite wall times =*", "suite * tests * wall * summed *"])
    rows = {match[1]: (int(match[2]), float(match[3]), float(match[4]))
            for line in result.stdout.lines
            if (match := re.fullmatch(r"(\S+)\s+(\d+)\s+([\d.]+)s\s+([\d.]+)s\s+\d+\s+[\d.]+s",
                                      line))}
    assert set(rows) == {"unit", "e2e", ROOT_FILES, "all"}
    assert rows["unit"][0] == 2 and rows["e2e"][0] == 1 and rows["all"][0] == 4
    # The fixture's setup and teardown count in the wall time, from setup start to teardown end.
    assert rows["e2e"][1] >= 0.6
    assert rows["e2e"][2] >= 0.6
    assert rows["all"][1] >= rows["e2e"][1]


# A stand-in for a vLLM API server: its command line names vLLM's server module, and it listens
# half a second after it starts, as a server does once its engine is up. (The run around this
# test sees it too, and counts one short start among the root files.)
FAKE_SERVER = (
    "import subprocess, sys, time\n"
    "CODE = ('import socket, time; time.sleep(0.5); s = socket.socket(); '\n"
    "        's.bind((\"127.0.0.1\", 0)); s.listen(); time.sleep(30)')\n"
    "def test_starts_a_server():\n"
    "    child = subprocess.Popen([sys.executable, '-c', CODE, 'vllm.entrypoints.stand_in'])\n"
    "    time.sleep(2.5)\n"
    "    child.kill()\n"
    "    child.wait()\n"
)


def run_with_a_server(pytester: pytest.Pytester) -> pytest.RunResult:
    """A run of one quick unit test and one e2e test that starts the stand-in server."""
    pytester.makepyfile(**{
        "tests/unit/test_fast.py": "def test_one():\n    pass\n",
        "tests/e2e/test_server.py": FAKE_SERVER,
    })
    result = pytester.runpytest("-p", "tests.suite_times", "-p", "no:cacheprovider",
                                "-p", "no:django", "-p", "no:asyncio")
    result.assert_outcomes(passed=2)
    return result


def test_the_summary_counts_the_vllm_servers_each_suite_started(pytester: pytest.Pytester) -> None:
    result = run_with_a_server(pytester)
    result.stdout.fnmatch_lines(["suite * tests * wall * summed *vllm *starting"])
    rows = {match[1]: (int(match[2]), float(match[3]))
            for line in result.stdout.lines
            if (match := re.fullmatch(r"(\S+)\s+\d+\s+[\d.]+s\s+[\d.]+s\s+(\d+)\s+([\d.]+)s",
                                      line))}
    assert rows["unit"] == (0, 0.0)
    assert rows["e2e"][0] == 1 and rows["all"][0] == 1
    # Listening came 0.5 s after the start; the watch polls once a second.
    assert 0.4 <= rows["e2e"][1] <= 2.5


def test_the_summary_names_the_costliest_files_with_their_servers(
        pytester: pytest.Pytester) -> None:
    result = run_with_a_server(pytester)
    result.stdout.fnmatch_lines(["*= the 2 costliest test files =*", "file * tests * summed *"])
    rows = {match[1]: (float(match[2]), int(match[3]))
            for line in result.stdout.lines
            if (match := re.fullmatch(r"(tests/\S+\.py)\s+\d+\s+([\d.]+)s\s+(\d+)\s+[\d.]+s",
                                      line))}
    assert list(rows) == ["tests/e2e/test_server.py", "tests/unit/test_fast.py"]
    assert rows["tests/e2e/test_server.py"][0] >= 2.5 and rows["tests/e2e/test_server.py"][1] == 1
    assert rows["tests/unit/test_fast.py"][1] == 0
