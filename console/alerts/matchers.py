"""Alertmanager's label matchers: ``{"name": ..., "op": "=", "value": ...}``, all must match.

Regular expressions are anchored at both ends, as Alertmanager's are; a label that is absent
is the empty string, so ``severity!=""`` means "has a severity".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

OPERATORS = ("=", "!=", "=~", "!~")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@lru_cache(maxsize=512)
def _pattern(value: str) -> re.Pattern[str]:
    return re.compile(f"(?:{value})")


def validate(matchers: Any, field: str = "matchers") -> list[dict[str, str]]:
    """The matchers, normalised; ValueError naming the field and the bad entry."""
    if not isinstance(matchers, list) or not matchers:
        raise ValueError(f"{field}: a non-empty list of {{name, op, value}}")
    clean = []
    for index, matcher in enumerate(matchers):
        where = f"{field}[{index}]"
        if not isinstance(matcher, dict):
            raise ValueError(f"{where}: an object with name, op and value")
        name, op, value = matcher.get("name"), matcher.get("op", "="), matcher.get("value")
        if not isinstance(name, str) or not LABEL_NAME.match(name):
            raise ValueError(f"{where}.name: a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if op not in OPERATORS:
            raise ValueError(f"{where}.op: one of {', '.join(OPERATORS)}")
        if not isinstance(value, str):
            raise ValueError(f"{where}.value: a string")
        if op in ("=~", "!~"):
            try:
                _pattern(value)
            except re.error as exc:
                raise ValueError(f"{where}.value: not a regular expression: {exc}") from exc
        clean.append({"name": name, "op": op, "value": value})
    return clean


def matches(matchers: Sequence[Mapping[str, str]], labels: Mapping[str, str]) -> bool:
    for matcher in matchers:
        actual = labels.get(matcher["name"], "")
        op, value = matcher.get("op", "="), matcher["value"]
        if op == "=":
            ok = actual == value
        elif op == "!=":
            ok = actual != value
        elif op == "=~":
            ok = _pattern(value).fullmatch(actual) is not None
        else:
            ok = _pattern(value).fullmatch(actual) is None
        if not ok:
            return False
    return True
