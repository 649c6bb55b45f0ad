"""The audit export's formats: JSON lines and CSV, one entry per line or row."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rest_framework.renderers import BaseRenderer

# A spreadsheet runs a cell that starts with one of these as a formula: an object's name is
# the client's text, so such a cell is quoted as text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class JSONLinesRenderer(BaseRenderer):
    media_type = "application/jsonl"
    format = "jsonl"
    charset = "utf-8"

    def render(self, data: Sequence[Mapping[str, Any]], accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in data).encode()


class CSVRenderer(BaseRenderer):
    """The serializer's fields as columns, in its order (``renderer_context["columns"]``);
    nested values (the changes) as JSON."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Sequence[Mapping[str, Any]], accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        columns = list((renderer_context or {})["columns"])
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(columns)
        for row in data:
            writer.writerow([_cell(row[column]) for column in columns])
        return out.getvalue().encode()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text
