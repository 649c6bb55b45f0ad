"""Paths of the API (``/api/v1/``): each is written once and answers with and without its
trailing slash, since clients write both. That is decided here, once: every app's
``api/urls.py`` takes its router from ``api_router()`` and writes a path that is no viewset's
with ``api_path()``, which end a path the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.urls import URLPattern, re_path
from drf_spectacular.utils import OpenApiParameter
from rest_framework.routers import DefaultRouter

# The end of every API path: an optional slash.
TRAILING_SLASH = "/?"
# The id in an api_path() route, "(?P<pk>[0-9]+)", for the schema: an integer, as a router's is.
ID = r"(?P<pk>[0-9]+)"
ID_PARAMETER = OpenApiParameter("id", int, OpenApiParameter.PATH)


def api_router(*, root_view: bool = False) -> DefaultRouter:
    """A router whose paths end in ``TRAILING_SLASH``; ``root_view``: it also answers the
    prefix itself with the list of its viewsets."""
    router = DefaultRouter(trailing_slash=False)
    router.trailing_slash = TRAILING_SLASH
    router.include_root_view = root_view
    return router


def api_path(route: str, view: Callable[..., Any], *, name: str) -> URLPattern:
    """A path that is no viewset's action; ``route`` is a regular expression without anchors
    or the trailing slash, e.g. ``rf"deployments/{ID}/gate"`` (and ``ID_PARAMETER`` in the view's
    ``extend_schema``)."""
    if route.startswith("^") or route.endswith(("/", "$")):
        raise ValueError(f"{route!r}: write the route without anchors or trailing slash")
    return re_path(rf"^{route}{TRAILING_SLASH}$", view, name=name)
