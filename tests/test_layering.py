"""The data plane (`inference`) must run without the console: it never imports Django."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = frozenset({"django", "rest_framework", "channels", "console"})
ENTRY_POINTS = ("inference.router.server", "inference.launch", "inference.kv_channels",
                "inference.prepare_model")


def forbidden_imports(source: str, filename: str = "<string>") -> list[str]:
    """Absolute imports of the console's stack in one module's source, with line numbers."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{filename}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] in FORBIDDEN]
    return found


def test_importing_the_data_plane_loads_no_console_module() -> None:
    script = (
        f"import sys, {', '.join(ENTRY_POINTS)}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{tuple(sorted(FORBIDDEN))!r})\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_no_inference_module_imports_the_console_stack() -> None:
    files = sorted((ROOT / "inference").rglob("*.py"))
    # Guards against walking an empty or wrong directory and passing vacuously.
    assert ROOT / "inference" / "router" / "server.py" in files
    problems = [problem for path in files
                for problem in forbidden_imports(path.read_text(), str(path.relative_to(ROOT)))]
    assert problems == []


def test_the_static_check_catches_every_import_form() -> None:
    source = (
        "import os\n"
        "import django\n"
        "import json, rest_framework.views\n"
        "from channels.layers import get_channel_layer\n"
        "from console.deployments import models\n"
        "from . import console\n"  # relative: inference's own module, allowed
        "def f():\n    import django.conf\n"  # imports inside functions count too
        "import djangoish\n"  # a different package that merely shares a prefix
    )
    assert forbidden_imports(source, "m.py") == [
        "m.py:2: django", "m.py:3: rest_framework.views", "m.py:4: channels.layers",
        "m.py:5: console.deployments", "m.py:8: django.conf",
    ]


ROUTER = ROOT / "inference" / "router"


def router_imports(path: Path) -> set[str]:
    """The router modules ``path`` imports, type-only imports included: a back-reference
    for annotations is a cycle a reader of the request path meets too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("inference.router"):
            module = node.module or ""
            names = [module] if module.count(".") > 1 else [
                f"{module}.{alias.name}" for alias in node.names]
            found.update(n for n in names if module_path(n) is not None)
    return found


def module_path(name: str) -> Path | None:
    relative = Path(*name.split(".")[2:])
    for candidate in (ROUTER / relative.with_suffix(".py"), ROUTER / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_router_modules_import_each_other_in_one_direction() -> None:
    graph = {f"inference.router.{'.'.join(p.relative_to(ROUTER).with_suffix('').parts)}"
             .removesuffix(".__init__"): router_imports(p) for p in ROUTER.rglob("*.py")}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for imported in graph.get(node, ()):
                if imported == start:
                    cycles.append(" -> ".join([*trail, start]))
                elif imported not in seen:
                    seen.add(imported)
                    stack.append((imported, [*trail, imported]))
    assert cycles == []
