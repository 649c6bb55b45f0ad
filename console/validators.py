"""Field validators shared by the console's apps."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from django import forms
from django.core.exceptions import ValidationError


def validate_model_path(value: str) -> None:
    path = PurePosixPath(value)
    if not path.is_absolute():
        raise ValidationError(f"must be an absolute path, got {value!r}")
    if ".." in path.parts:
        raise ValidationError(f"must not contain '..', got {value!r}")


# A DNS host name (RFC 1123): dot-separated labels of letters, digits and hyphens, neither
# starting nor ending with a hyphen, at most 63 characters each and 253 in all.
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
MAX_LIST_ENTRIES = 32


def _string_list(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationError(f'expected a JSON list of {what}, e.g. {EXAMPLES[what]}')
    if len(value) > MAX_LIST_ENTRIES:
        raise ValidationError(f"at most {MAX_LIST_ENTRIES} entries, got {len(value)}")
    repeated = sorted({item for item in value if value.count(item) > 1})
    if repeated:
        raise ValidationError(f"{', '.join(map(repr, repeated))} given more than once")
    return value


EXAMPLES = {"directories": '["/srv/images"]', "host names": '["images.example.com"]'}


def validate_directory_list(value: object) -> None:
    """Absolute directories that exist here (where the router runs and reads them)."""
    for item in _string_list(value, "directories"):
        validate_model_path(item)
        if not Path(item).is_dir():
            raise ValidationError(f"{item!r} is not an existing directory")


def validate_host_name(value: str) -> None:
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in value.split(".")):
        raise ValidationError(f"{value!r} is not a host name such as images.example.com "
                              "(no scheme, port or path)")


def validate_host_name_list(value: object) -> None:
    for item in _string_list(value, "host names"):
        validate_host_name(item)


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
