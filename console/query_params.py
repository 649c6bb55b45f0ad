"""Integer query parameters of the API, parsed once: a value out of bounds is a 400 naming the
parameter, never an integer the database cannot hold (a 500)."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError

# The largest row id any of the databases stores (64-bit signed integers).
MAX_ID = 2**63 - 1


def bounded_int(raw: str, name: str, minimum: int, maximum: int) -> int:
    """``raw`` as an integer within ``minimum``..``maximum``; else a 400 naming ``name``."""
    # str.isdigit() holds for '²' too, which int() refuses: only ASCII digits with an optional
    # sign, and no more of them than a 64-bit integer has.
    digits = raw[1:] if raw[:1] in "+-" else raw
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise ValidationError({name: [f"expected an integer from {minimum} to {maximum}, got {raw!r}"]})
    value = int(raw)
    if not minimum <= value <= maximum:
        raise ValidationError({name: [f"must be from {minimum} to {maximum}, got {value}"]})
    return value
