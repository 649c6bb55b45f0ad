"""The API's exception handler: DRF's, plus a model's ValidationError answered as a 400.

A model's ``full_clean`` (called by the services a view hands validated data to) judges what
only the model can; its error names the model's fields, and is the client's to fix, not a 500.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as ModelValidationError
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ModelValidationError):
        exc = ValidationError(as_serializer_error(exc))
    return drf_exception_handler(exc, context)
