"""The one error the advisor raises for bad input: it names the flag or field at fault."""

from __future__ import annotations


class InputError(ValueError):
    """``where``: the flag or JSON field (dotted path) the message is about."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
