"""Field validators shared by the console's apps."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from django import forms
from django.core.exceptions import ValidationError


def validate_model_path(value: str) -> None:
    path = PurePosixPath(value)
    if not path.is_absolute():
        raise ValidationError(f"must be an absolute path, got {value!r}")
    if ".." in path.parts:
        raise ValidationError(f"must not contain '..', got {value!r}")


def validate_port(value: int) -> None:
    if not 1 <= value <= 65535:
        raise ValidationError(f"port {value} is outside 1-65535")


def validate_core_list(value: str) -> None:
    if value == "":
        return
    parts = value.split(",")
    if not all(part.strip().isdigit() for part in parts):
        raise ValidationError(f"expected comma-separated core numbers like '0,1', got {value!r}")


def since_not_after_until(form: forms.Form, data: dict[str, Any]) -> None:
    """A filter form's ``since``..``until`` range: ``until`` before ``since`` is an error on
    ``until`` (the API's 400 names it)."""
    since, until = data.get("since"), data.get("until")
    if since is not None and until is not None and since > until:
        form.add_error("until", "must not be before since")
