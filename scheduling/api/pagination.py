"""Cursor pagination for every list endpoint; bad cursors and page sizes are 400, not 404."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.pagination import Cursor
from rest_framework.pagination import CursorPagination as _CursorPagination
from rest_framework.request import Request


class CursorPagination(_CursorPagination):
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    ordering = "-id"

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError(
                {self.page_size_query_param: [f"Give a whole number from 1 to {self.max_page_size}."]}
            )
        return size

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            return super().decode_cursor(request)
        except exceptions.NotFound:
            # DRF answers 404 for a cursor it cannot decode; it is bad input, not a missing page.
            raise exceptions.ValidationError({self.cursor_query_param: ["Invalid cursor."]}) from None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        # A cursor decodes to any text position (``p=notadate``, ``p=1e5``, a bigint overflow);
        # the database field refuses it only when the page is read.  That is bad input: 400.
        from django.core.exceptions import ValidationError as DjangoValidationError
        from django.db import DataError

        try:
            return super().paginate_queryset(queryset, request, view)
        except (ValueError, TypeError, OverflowError, DjangoValidationError, DataError):
            if request.query_params.get(self.cursor_query_param) is None:
                raise
            raise exceptions.ValidationError({self.cursor_query_param: ["Invalid cursor."]}) from None

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return parameters
