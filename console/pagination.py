"""The API's one pagination: ``?limit=&offset=`` with bounds, refused with a 400 naming the
parameter when out of them.

DRF's own LimitOffsetPagination passes any integer to the database (a 20-digit limit overflows
SQLite's 64-bit integers: a 500) and silently replaces a negative or malformed one with the
default, so a client's typo returns a page it did not ask for.
"""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from console.query_params import bounded_int

MAX_LIMIT = 1000
# Far beyond any table the console keeps, far inside the databases' 64-bit OFFSET.
MAX_OFFSET = 10**9


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None or raw == "":
            return int(self.default_limit)
        return bounded_int(raw, self.limit_query_param, 1, MAX_LIMIT)

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None or raw == "":
            return 0
        return bounded_int(raw, self.offset_query_param, 0, MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        bounds = {self.limit_query_param: (1, MAX_LIMIT), self.offset_query_param: (0, MAX_OFFSET)}
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {**parameter["schema"], "minimum": low, "maximum": high}
        return parameters
