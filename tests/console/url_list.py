"""Every URL pattern of the console, pages and API, as a template such as
``api/v1/deployments/{pk}/start/``: what the generated permission and audit tests walk."""

from __future__ import annotations

import re
from collections.abc import Iterator

from django.urls import URLPattern, URLResolver, get_resolver

UNSAFE = ("post", "put", "patch", "delete")
# Django's admin has its own permissions (staff users); the format-suffix copies of API paths
# answer as the path without the suffix does.
SKIPPED = re.compile(r"^admin/|\{format\}")


def _template(route: str) -> str:
    route = route.replace("^", "").replace("$", "").replace("/?", "/")
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
    route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
    return route


def _walk(patterns: list, prefix: str = "") -> Iterator[str]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield _template(prefix + str(pattern.pattern))


def templates() -> list[str]:
    return sorted({t for t in _walk(get_resolver().url_patterns) if not SKIPPED.search(t)})


def is_api(template: str) -> bool:
    return template.startswith("api/")


def placeholders(template: str) -> list[str]:
    return re.findall(r"\{(\w+)\}", template)


def fill(template: str, values: dict[str, object]) -> str:
    return "/" + template.format(**values)
