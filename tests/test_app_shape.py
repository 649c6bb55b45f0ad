"""Every console app has the same shape: its pages in ``urls.py`` and ``views.py``, its API in
``api/urls.py`` and ``api/views.py``; no second module of either kind. Beyond the modules every
app may have, a module's name is used once in the console, so that it says what it holds."""

from __future__ import annotations

import ast
from pathlib import Path

from console.layers import APP_ORDER

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = ROOT / "console"
URL_MODULES = {"urls.py", "api/urls.py"}
VIEW_MODULES = {"views.py", "api/views.py"}
VIEW_DECORATORS = {"api_view", "login_required", "require_GET", "require_POST", "require_http_methods"}
# The modules any app may have, each holding the same kind of thing in every app.
SHARED_NAMES = {"__init__.py", "admin.py", "apps.py", "forms.py", "models.py", "serializers.py",
                "services.py", "urls.py", "views.py"}
VIEW_BASES = {"View", "APIView", "GenericAPIView", "ViewSet", "GenericViewSet", "ModelViewSet",
              "ReadOnlyModelViewSet"}


def _name(node: ast.expr) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def defines_views(source: str) -> bool:
    """Whether a module defines a view: a decorated view function or a view class."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                _name(d) in VIEW_DECORATORS for d in node.decorator_list):
            return True
        if isinstance(node, ast.ClassDef) and any(_name(b) in VIEW_BASES for b in node.bases):
            return True
    return False


def defines_urls(source: str) -> bool:
    return any(isinstance(node, ast.Assign | ast.AnnAssign) and any(
        isinstance(t, ast.Name) and t.id == "urlpatterns"
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in ast.parse(source).body)


def app_modules() -> list[tuple[str, Path]]:
    return [(app, path) for app in APP_ORDER for path in sorted((CONSOLE / app).rglob("*.py"))
            if "migrations" not in path.parts]


def test_urls_and_views_live_in_their_one_module_per_app() -> None:
    modules = app_modules()
    # Guards against walking a wrong directory and passing vacuously.
    assert ("live", CONSOLE / "live" / "views.py") in modules
    misplaced = []
    for app, path in modules:
        where = path.relative_to(CONSOLE / app).as_posix()
        source = path.read_text()
        if defines_urls(source) and where not in URL_MODULES:
            misplaced.append(f"{app}/{where}: urlpatterns outside urls.py and api/urls.py")
        if defines_views(source) and where not in VIEW_MODULES:
            misplaced.append(f"{app}/{where}: views outside views.py and api/views.py")
        if path.stem.endswith(("urls", "views")) and where not in URL_MODULES | VIEW_MODULES:
            misplaced.append(f"{app}/{where}: a second urls or views module")
    assert misplaced == []


def test_the_check_finds_views_and_urls() -> None:
    assert defines_views("@login_required\ndef page(request): ...\n")
    assert defines_views("@api_view(['GET'])\ndef read(request): ...\n")
    assert defines_views("class V(viewsets.ReadOnlyModelViewSet): ...\n")
    assert not defines_views("def helper(request): ...\nclass Form(forms.Form): ...\n")
    assert defines_urls("urlpatterns = [path('x/', view)]\n")
    assert not defines_urls("websocket_urlpatterns = []\n")


def test_the_root_urls_include_each_apps_two_url_modules_only() -> None:
    tree = ast.parse((CONSOLE / "urls.py").read_text())
    included = [node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and _name(node.func) == "include"
                and node.args and isinstance(node.args[0], ast.Constant)]
    assert "console.live.urls" in included
    allowed = {f"console.{app}.{module}" for app in APP_ORDER for module in ("urls", "api.urls")}
    assert [name for name in included if name not in allowed] == []
    assert len(included) == len(set(included))


def test_a_module_name_is_used_once_beyond_the_shared_ones() -> None:
    modules = [path for path in CONSOLE.rglob("*.py")
               if "migrations" not in path.parts and path.name not in SHARED_NAMES]
    assert CONSOLE / "supervisor" / "engine.py" in modules
    names: dict[str, list[str]] = {}
    for path in modules:
        names.setdefault(path.name, []).append(path.relative_to(CONSOLE).as_posix())
    assert {name: sorted(paths) for name, paths in names.items() if len(paths) > 1} == {}
