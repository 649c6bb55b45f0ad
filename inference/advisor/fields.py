"""Reading typed values out of parsed JSON, each failure naming its field (dotted path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inference.advisor.errors import InputError


def read_json(path: Path, flag: str) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(flag, f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(flag, f"{path} is not JSON: {exc}") from exc


def mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(where, f"expected an object, got {type(value).__name__}")
    return value


def known_keys(value: dict[str, Any], allowed: set[str], where: str) -> None:
    """A misspelt optional key would otherwise be ignored and its default used silently."""
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InputError(f"{where}.{unknown[0]}" if where else unknown[0],
                         f"unknown field (expected one of {', '.join(sorted(allowed))})")


def number(value: Any, where: str, *, minimum: float = 0.0, above: bool = False) -> float:
    # bool is an int to Python; true/false in a speeds file is a mistake, not 1/0.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(where, f"expected a number, got {json.dumps(value)}")
    if value < minimum or (above and value == minimum):
        raise InputError(where, f"must be {'above' if above else 'at least'} {minimum:g}, got {value}")
    return float(value)


def integer(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(where, f"expected a whole number, got {json.dumps(value)}")
    if value < minimum:
        raise InputError(where, f"must be at least {minimum}, got {value}")
    return value


def numbers(value: Any, where: str) -> list[float]:
    if not isinstance(value, list) or not value:
        raise InputError(where, "expected a non-empty list of numbers")
    return [number(v, f"{where}[{i}]") for i, v in enumerate(value)]


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(where, f"expected true or false, got {json.dumps(value)}")
    return value
