"""One exception handler for the whole API: every error is ``{"message", "fields"}``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {str(k): _flatten(v) for k, v in detail.items()}
    if isinstance(detail, list):
        out: list[Any] = []
        for item in detail:
            flat = _flatten(item)
            out.extend(flat if isinstance(flat, list) and not isinstance(item, (dict, list)) else [flat])
        return out
    return [str(detail)]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        fields = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = exceptions.ValidationError(detail=fields)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        fields = _flatten(detail) if isinstance(detail, dict) else {"non_field_errors": _flatten(detail)}
        response.data = {"message": "Validation failed.", "fields": fields}
        response.status_code = status.HTTP_400_BAD_REQUEST
    else:
        detail = getattr(exc, "detail", str(exc))
        message = str(detail) if not isinstance(detail, (dict, list)) else "Request failed."
        response.data = {"message": message, "fields": {}}
    return response
