"""One exception handler for the whole API: every error is ``{"message", "fields"}``.

Also the JSON parser the API uses, which enforces ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (DRF reads
the request stream itself, so Django's own limit never applies to JSON bodies).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, parsers, serializers, status
from rest_framework.response import Response

if TYPE_CHECKING:
    from scheduling.services import BookingConflictError

logger = logging.getLogger(__name__)


class RequestTooLargeError(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with a body size limit (413 above ``DATA_UPLOAD_MAX_MEMORY_SIZE``)."""

    def parse(
        self,
        stream: IO[Any] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        if limit is not None and request is not None:
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit:
                raise RequestTooLargeError()
        if stream is None:
            raise exceptions.ParseError("The request body is empty.")
        # Content-Length may be absent or lie: never read more than the limit.
        body = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(body) > limit:
            raise RequestTooLargeError()
        try:
            data = super().parse(io.BytesIO(body), media_type, parser_context)
        except RecursionError:  # nesting deep enough to exhaust the decoder's stack
            raise exceptions.ParseError(
                f"The JSON body nests deeper than {settings.BERTH_JSON_MAX_DEPTH} levels."
            ) from None
        _reject_unstorable_text(data)
        return data


def _reject_unstorable_text(value: Any) -> None:
    """Refuse strings PostgreSQL cannot store (NUL characters, lone UTF-16 surrogates) and nesting
    deeper than ``BERTH_JSON_MAX_DEPTH`` (serializers and renderers recurse on it).

    Valid JSON may contain ``\\u0000`` or an unpaired ``\\ud800``; PostgreSQL rejects both
    (in text and in jsonb), which would otherwise surface as a 500 deep inside a lookup.
    """
    max_depth = settings.BERTH_JSON_MAX_DEPTH
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)) and depth >= max_depth:
            raise exceptions.ParseError(f"The JSON body nests deeper than {max_depth} levels.")
        if isinstance(item, str):
            if "\x00" in item:
                raise exceptions.ParseError("The JSON body contains a NUL character.")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise exceptions.ParseError(
                    "The JSON body contains invalid Unicode (a lone surrogate)."
                ) from None
        elif isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


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


def _as_json_datetime(value: datetime) -> str:
    """The same text DRF's DateTimeField renders (UTC as ``Z``), so clients parse one format."""
    return str(serializers.DateTimeField().to_representation(value))


def _conflict_response(exc: BookingConflictError) -> Response:
    alternatives = [
        {
            "cluster": a.cluster,
            "gpu_type": a.gpu_type,
            "gpu_count": a.gpu_count,
            "start_at": _as_json_datetime(a.start_at),
            "end_at": _as_json_datetime(a.end_at),
        }
        for a in exc.alternatives
    ]
    return Response(
        {"message": exc.message, "fields": exc.fields, "alternatives": alternatives},
        status=status.HTTP_409_CONFLICT,
    )


def _unexpected_error_response(exc: Exception, context: dict[str, Any]) -> Response:
    """Not an API error: 503 + ``Retry-After`` while the database is down, else a logged 500 —
    both in the documented shape (never Django's HTML page)."""
    from rest_framework.views import set_rollback

    from portal.outage import describe_database_error, is_database_down

    request = context.get("request")
    where = f"{request.method} {request.path}" if request is not None else "API"
    set_rollback()
    if is_database_down(exc):
        logger.warning("database unreachable: %s answered 503: %s", where, describe_database_error(exc))
        unavailable = Response(
            {
                "message": "The service is briefly unavailable (its database is unreachable); retry shortly.",
                "fields": {},
            },
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
        unavailable["Retry-After"] = str(settings.BERTH_OUTAGE_RETRY_AFTER_S)
        return unavailable
    logging.getLogger("django.request").error("Internal error: %s", where, exc_info=exc)
    return Response(
        {"message": "Internal error; it has been logged.", "fields": {}},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Map service and DRF errors to ``{"message", "fields"}`` (409 adds ``alternatives``)."""
    # Imported here, not at the top: DRF imports this module (for the parser) while its own
    # views module and the apps are still loading.
    from rest_framework.views import exception_handler as drf_exception_handler

    from scheduling.services import BookingConflictError

    if isinstance(exc, BookingConflictError):
        return _conflict_response(exc)
    if isinstance(exc, DjangoValidationError):
        fields = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        exc = exceptions.ValidationError(detail=fields)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(detail=str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestTooLargeError()

    response = drf_exception_handler(exc, context)
    if response is None:
        return _unexpected_error_response(exc, context)
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        fields = _flatten(detail) if isinstance(detail, dict) else {"non_field_errors": _flatten(detail)}
        response.data = {"message": "Validation failed.", "fields": fields}
        response.status_code = status.HTTP_400_BAD_REQUEST
    else:
        error_detail: Any = getattr(exc, "detail", None) or str(exc)
        message = str(error_detail) if not isinstance(error_detail, (dict, list)) else "Request failed."
        exc_fields = getattr(exc, "fields", None)  # e.g. a reused Idempotency-Key names the header
        response.data = {"message": message, "fields": exc_fields if isinstance(exc_fields, dict) else {}}
    return response
