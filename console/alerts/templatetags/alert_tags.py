from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def get_item(mapping: dict[Any, Any] | None, key: Any) -> Any:
    """``mapping[key]`` in a template (the deployment list's firing counts by id)."""
    return (mapping or {}).get(key)
