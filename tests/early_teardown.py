"""A session-wide set of vLLM servers ends after its last user, not at the end of the session,
and the users of each set run one after another.

The borrowed tiny-model deployment (tests/borrowed.py) and the e2e stack (tests/e2e/conftest.py)
are several vLLM servers each, about 3.4 GB and a share of a core apiece even when idle. Kept to
the end of the session they ran beside every later suite's own servers, on two cores and 24 GB:
later starts slowed down by minutes and memory ran short. So the tests that use one set are
grouped (files keep their order within a group; a file whose tests use none comes last), and the
set is closed in the teardown of its last user.

tests/conftest.py registers ``LastUsers`` as a plugin. A conftest registers a set with
``register(fixture_name, defined_in, close)``; ``close`` must be idempotent (the fixture's own
teardown at the end of the session may call it again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

# (fixture name, the conftest directory that defines it) -> its close. Two fixtures may share a
# name (the e2e stack and the quality suite's): the pair tells them apart.
_CLOSERS: dict[tuple[str, str], Callable[[], None]] = {}
# The name tests/conftest.py registers ``LastUsers`` under.
PLUGIN_NAME = "pdserve-early-teardown"


def register(fixture_name: str, defined_in: str, close: Callable[[], None]) -> None:
    """``defined_in``: the directory of the conftest that defines the fixture, as a node id
    (``tests/e2e``)."""
    _CLOSERS[(fixture_name, defined_in)] = close


def _uses(item: pytest.Item, fixture_name: str) -> bool:
    return fixture_name in getattr(item, "fixturenames", ())


def group_of(items: list[pytest.Item], fixture_names: list[str]) -> dict[str, int]:
    """Each file's group: the index of the first of ``fixture_names`` one of its tests uses,
    or ``len(fixture_names)`` if none."""
    groups: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        group = next((i for i, name in enumerate(fixture_names) if _uses(item, name)),
                     len(fixture_names))
        groups[path] = min(groups.get(path, group), group)
    return groups


def order_by_set(items: list[pytest.Item], directory: str, fixture_names: list[str],
                 last_files: tuple[str, ...] = ()) -> None:
    """Reorder, in place, the tests under ``directory`` (a contiguous run in pytest's order) so
    that the users of each set come together, in the order of ``fixture_names``; inside its
    group a file named in ``last_files`` goes after the others (a set's last user need not
    undo what it changed, see ``is_last_user``)."""
    indices = [i for i, item in enumerate(items) if f"/{directory}/" in f"/{item.nodeid}"]
    if not indices:
        return
    chosen = [items[i] for i in indices]
    groups = group_of(chosen, fixture_names)

    def key(item: pytest.Item) -> tuple[int, bool]:
        return groups[str(item.path)], item.path.name in last_files

    # sorted() is stable: files, and tests within a file, keep their order inside a group.
    for index, item in zip(indices, sorted(chosen, key=key), strict=True):
        items[index] = item


def is_last_user(item: pytest.Item, fixture_name: str, defined_in: str) -> bool:
    """Whether ``item`` is the last test of the session to use the set: the set is closed in
    its teardown, so nothing it leaves behind reaches another test."""
    plugin = item.config.pluginmanager.get_plugin(PLUGIN_NAME)
    return isinstance(plugin, LastUsers) and plugin.last.get((fixture_name, defined_in)) == item.nodeid


class LastUsers:
    """Closes each registered set in the teardown of the last test that uses it."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], str] = {}

    # After collection is final: conftests reorder in pytest_collection_modifyitems, and
    # options such as --ff and --nf after them.
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.last = {}
        for item in session.items:
            info = getattr(item, "_fixtureinfo", None)
            if info is None:
                continue
            for name in item.fixturenames:
                definitions = info.name2fixturedefs.get(name)
                if definitions:  # the last definition is the one this test gets
                    self.last[(name, definitions[-1].baseid)] = item.nodeid

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        yield
        for key, close in _CLOSERS.items():
            if self.last.get(key) == item.nodeid:
                close()
