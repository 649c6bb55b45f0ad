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


def package_imports(path: Path, package: str, root: Path) -> set[str]:
    """The modules of ``package`` (found under ``root``) that ``path`` imports: absolute and
    relative, at top level, inside functions and under ``if TYPE_CHECKING`` (a back-reference
    for annotations is a cycle a reader of the request path meets too)."""
    here = package.split(".") + list(path.relative_to(root).with_suffix("").parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative to the importing module's package (an __init__ is its own package).
                base = here[:len(here) - node.level + (path.name == "__init__.py")]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            # `from pkg import name` imports pkg, and pkg.name when that is a module.
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in candidates
                     if module_path(name, package, root) is not None)
    return found


def module_path(name: str, package: str, root: Path) -> Path | None:
    if name != package and not name.startswith(f"{package}."):
        return None
    parts = name.split(".")[package.count(".") + 1:]
    if not parts:
        return root / "__init__.py"
    relative = Path(*parts)
    for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_graph(package: str, root: Path) -> dict[str, set[str]]:
    graph = {}
    for path in root.rglob("*.py"):
        name = ".".join([package, *path.relative_to(root).with_suffix("").parts])
        graph[name.removesuffix(".__init__")] = package_imports(path, package, root) - {
            name.removesuffix(".__init__")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every module that can reach itself again, with one such path."""
    found = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for imported in sorted(graph.get(node, ())):
                if imported == start:
                    found.append(" -> ".join([*trail, start]))
                elif imported not in seen:
                    seen.add(imported)
                    stack.append((imported, [*trail, imported]))
    return found


def test_the_router_modules_import_each_other_in_one_direction() -> None:
    graph = import_graph("inference.router", ROUTER)
    # Guards against a graph that lost its edges and passes vacuously.
    assert "inference.router.backends" in graph["inference.router.groups"]
    assert cycles(graph) == []


def test_the_cycle_check_sees_every_import_form(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("from pkg.b import B\n")
    (root / "b.py").write_text("from typing import TYPE_CHECKING\n"
                               "if TYPE_CHECKING:\n    from pkg.a import A\n")
    (root / "c.py").write_text("def f():\n    import pkg.sub.d\n")
    (root / "sub" / "d.py").write_text("from .. import c\n")
    (root / "e.py").write_text("from pkg import a\n")
    graph = import_graph("pkg", root)
    assert graph["pkg.e"] == {"pkg", "pkg.a"}
    assert cycles(graph) == ["pkg.a -> pkg.b -> pkg.a", "pkg.b -> pkg.a -> pkg.b",
                             "pkg.c -> pkg.sub.d -> pkg.c", "pkg.sub.d -> pkg.c -> pkg.sub.d"]
