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


def test_each_set_runs_together_and_closes_after_its_last_user(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    # The project's ``tests`` package, for the plugin; the files below live in ``suite``.
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(**{
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
    })
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=7)
    [line] = [line for line in result.outlines if line.startswith("EVENTS=")]
    events = line.removeprefix("EVENTS=").split(",")
    # alpha's files (with a plain test of one of them), then beta's, then the rest of e2e; the
    # tests outside e2e keep their place, so gamma's last user is a unit test.
    assert events == ["test_alpha_1", "test_alpha_plain", "test_both", "closed alpha",
                      "test_beta_1", "closed beta", "test_none_1", "test_beta_2",
                      "test_gamma_2", "closed gamma"], events
