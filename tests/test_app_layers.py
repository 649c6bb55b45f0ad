"""Console apps depend in one direction: an app imports only the apps before it in
``console.layers.APP_ORDER``, at module level or inside a function alike."""

from __future__ import annotations

import ast
from pathlib import Path

from console.layers import APP_ORDER

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = ROOT / "console"


def app_of(module: str) -> str | None:
    """The console app a dotted module name belongs to, if any."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "console" and parts[1] in APP_ORDER else None


def reverse_imports(source: str, app: str, filename: str = "<string>") -> list[str]:
    """Imports in one module of ``app`` that reach an app at or after it in the order, other
    than ``app`` itself."""
    rank = APP_ORDER.index(app)
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from console import control" names the app in the imported name.
            names = [node.module] if node.module != "console" else \
                [f"console.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = app_of(name)
            if target is not None and target != app and APP_ORDER.index(target) > rank:
                found.append(f"{filename}:{node.lineno}: {app} imports {target} ({name})")
    return found


def console_modules() -> list[tuple[str, Path]]:
    """Every module of every app, migrations included (they name other apps' models too)."""
    return [(app, path) for app in APP_ORDER for path in sorted((CONSOLE / app).rglob("*.py"))]


def test_every_console_app_is_in_the_order() -> None:
    # Every package of the console is an app here, Django app or not (checks has no models).
    packages = {path.parent.name for path in CONSOLE.glob("*/__init__.py")}
    assert packages == set(APP_ORDER)


def test_no_app_imports_an_app_after_it() -> None:
    modules = console_modules()
    # Guards against walking a wrong directory and passing vacuously.
    assert (("control", CONSOLE / "control" / "daemon.py") in modules
            and len(modules) > 100)
    problems = [problem for app, path in modules
                for problem in reverse_imports(path.read_text(), app, str(path.relative_to(ROOT)))]
    assert problems == []


def test_the_check_catches_a_planted_reverse_import() -> None:
    source = (
        "import os\n"
        "from console.fleet.models import Node\n"          # before: allowed
        "from console.control.lifecycle import start\n"    # after: reverse
        "import console.quality.services\n"                # after: reverse
        "from console import playground\n"                 # after, by name
        "from console.deployments import plans\n"          # its own app: allowed
        "def f():\n    from console.supervisor import models\n"  # inside a function counts too
        "from consoleish import x\n"                       # another package with the prefix
        "from . import views\n"                            # relative, within the app
    )
    assert reverse_imports(source, "deployments", "m.py") == [
        "m.py:3: deployments imports control (console.control.lifecycle)",
        "m.py:4: deployments imports quality (console.quality.services)",
        "m.py:5: deployments imports playground (console.playground)",
        "m.py:8: deployments imports supervisor (console.supervisor)",
    ]


def test_a_planted_reverse_import_in_a_real_module_fails_the_check(tmp_path: Path) -> None:
    # The real fleet/models.py with one import of the composition root added at the end.
    path = CONSOLE / "fleet" / "models.py"
    planted = path.read_text() + "\nfrom console.control.status import overall_state\n"
    assert reverse_imports(planted, "fleet", "fleet/models.py") == [
        f"fleet/models.py:{planted.count(chr(10))}: fleet imports control "
        "(console.control.status)"
    ]
