"""The early teardown plugin: the users of each shared set run together, and the set is closed
right after its last user, before the tests that do not use it."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from tests import early_teardown

EVENTS = []

def pytest_configure(config):
    config.pluginmanager.register(early_teardown.LastUsers(), "early")

def pytest_collection_modifyitems(items):
    early_teardown.order_by_set(items, "e2e", ["alpha", "beta"])

def _closer(name):
    def close():
        if name not in EVENTS:
            EVENTS.append(f"closed {name}")
    return close

# Defined in this conftest: the root directory, node id "".
early_teardown.register("alpha", "", _closer("alpha"))
early_teardown.register("beta", "", _closer("beta"))
early_teardown.register("gamma", "", _closer("gamma"))

@pytest.fixture(scope="session")
def alpha():
    return "alpha"

@pytest.fixture(scope="session")
def beta():
    return "beta"

@pytest.fixture(scope="session")
def gamma():
    return "gamma"

@pytest.fixture(autouse=True)
def record(request):
    EVENTS.append(request.node.name)

def pytest_sessionfinish(session):
    print("\\nEVENTS=" + ",".join(EVENTS))
"""


def events(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str,
           files: dict[str, str], passed: int) -> list[str]:
    """Run ``files`` under ``conftest`` in a pytest of their own; the EVENTS it printed."""
    pytester.makeconftest(conftest)
    # The project's ``tests`` package, for the plugin; the files live in ``suite``.
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(**files)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=passed)
    [line] = [line for line in result.outlines if line.startswith("EVENTS=")]
    return line.removeprefix("EVENTS=").split(",")


def test_each_set_runs_together_and_closes_after_its_last_user(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = events(pytester, monkeypatch, CONFTEST, {
        "suite/e2e/test_a_none.py": "def test_none_1(gamma):\n    pass\n",
        "suite/e2e/test_b_beta.py": "def test_beta_1(beta):\n    pass\n",
        "suite/e2e/test_c_alpha.py": ("def test_alpha_1(alpha):\n    pass\n\n"
                                      "def test_alpha_plain():\n    pass\n"),
        "suite/e2e/test_d_both.py": "def test_both(alpha, beta):\n    pass\n",
        # A fixture of the same name defined elsewhere is another set: it keeps the root's
        # beta from waiting for this test.
        "suite/unit/conftest.py": "import pytest\n\n@pytest.fixture\ndef beta():\n"
                                  "    return 'the unit tests own'\n",
        "suite/unit/test_e_later.py": ("def test_beta_2(beta):\n    pass\n\n"
                                       "def test_gamma_2(gamma):\n    pass\n"),
    }, passed=7)
    # alpha's files (with a plain test of one of them), then beta's, then the rest of e2e; the
    # tests outside e2e keep their place, so gamma's last user is a unit test.
    assert seen == ["test_alpha_1", "test_alpha_plain", "test_both", "closed alpha",
                    "test_beta_1", "closed beta", "test_none_1", "test_beta_2",
                    "test_gamma_2", "closed gamma"], seen


LAST_CONFTEST = """
import pytest
from tests import early_teardown

EVENTS = []

def pytest_configure(config):
    config.pluginmanager.register(early_teardown.LastUsers(), early_teardown.PLUGIN_NAME)

def pytest_collection_modifyitems(items):
    early_teardown.order_by_set(items, "e2e", ["alpha"], last_files=("test_a_first.py",))

early_teardown.register("alpha", "", lambda: EVENTS.append("closed alpha"))

@pytest.fixture
def alpha(request):
    last = early_teardown.is_last_user(request.node, "alpha", "")
    EVENTS.append(f"{request.node.name}{' (last)' if last else ''}")

def pytest_sessionfinish(session):
    print("\\nEVENTS=" + ",".join(EVENTS))
"""


def test_a_file_named_last_goes_after_its_group_and_its_last_test_knows(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = events(pytester, monkeypatch, LAST_CONFTEST, {
        "suite/e2e/test_a_first.py": ("def test_a_1(alpha):\n    pass\n\n"
                                      "def test_a_2(alpha):\n    pass\n"),
        "suite/e2e/test_b_second.py": "def test_b_1(alpha):\n    pass\n",
        "suite/e2e/test_c_none.py": "def test_c_1():\n    pass\n",
    }, passed=4)
    # test_a_first.py after test_b_second.py, still before the files of no set; only its
    # second test is the set's last user.
    assert seen == ["test_b_1", "test_a_1", "test_a_2 (last)", "closed alpha"], seen
