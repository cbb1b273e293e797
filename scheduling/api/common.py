"""Pieces shared by the API views: error schemas, pagination and slug lookups."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.urls import Resolver404, resolve
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.api.pagination import CursorPagination


def request_user(request: Request) -> User:
    """The signed-in user (``IsAuthenticated`` already refused anonymous requests)."""
    user = request.user
    if not isinstance(user, User):
        raise exceptions.NotAuthenticated()
    return user


class JsonNegotiation(DefaultContentNegotiation):
    """DRF's content negotiation, answered at once for what API clients send.

    Parsing the ``Accept`` header into media types was a tenth of an availability request's
    CPU; with JSON the first renderer, ``*/*``, ``application/json`` or no header can only
    choose it (exactly what DRF would return).  Anything else goes through DRF.
    """

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        first = renderers[0] if renderers else None
        if (
            first is not None
            and first.media_type == "application/json"
            and format_suffix is None
            and self.settings.URL_FORMAT_OVERRIDE not in request.query_params
        ):
            accept = request.META.get("HTTP_ACCEPT", "")
            if accept in ("", "*/*", "application/json"):
                return first, first.media_type
        return super().select_renderer(request, renderers, format_suffix)


class AwareDateTimeField(serializers.DateTimeField):
    """An input datetime that must carry its timezone (``Z`` or ``+02:00``).

    DRF reads a naive datetime in the server's zone (UTC), silently: a client in Berlin who
    forgot the offset would book an hour off.  Refused with the service's own message.
    """

    def to_internal_value(self, value: Any) -> datetime:
        parsed = super().to_internal_value(value)
        if isinstance(value, str) and value.strip() and _is_naive_text(value):
            raise serializers.ValidationError("Give a timezone (for example 2026-01-31T09:00:00Z).")
        return parsed


def _is_naive_text(value: str) -> bool:
    from django.utils.dateparse import parse_datetime

    try:
        parsed = parse_datetime(value.strip())
    except ValueError:
        return False
    return parsed is not None and timezone.is_naive(parsed)


def short(text: object, *, limit: int = 60) -> str:
    """User input quoted in an error message, cut to ``limit`` characters (a 10,000-character
    name must not come back whole)."""
    value = str(text)
    return value if len(value) <= limit else value[: limit - 1] + "…"


class SlugRelatedField(serializers.SlugRelatedField[Any]):
    """DRF's slug field whose "does not exist" message quotes the given name cut short."""

    def fail(self, key: str, **kwargs: Any) -> Any:
        if "value" in kwargs:
            kwargs["value"] = short(kwargs["value"])
        return super().fail(key, **kwargs)


class ErrorSerializer(serializers.Serializer[Any]):
    message = serializers.CharField()
    # Shadows Serializer.fields only in the class body: DRF's metaclass moves declared fields away.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.JSONField(),
        help_text="Field name -> list of messages (an object of the same shape for nested fields).",
    )


class AlternativeSerializer(serializers.Serializer[Any]):
    cluster = serializers.CharField()
    gpu_type = serializers.CharField()
    gpu_count = serializers.IntegerField()
    start_at = serializers.DateTimeField()
    end_at = serializers.DateTimeField()


class ConflictSerializer(ErrorSerializer):
    alternatives = AlternativeSerializer(many=True)


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """OpenAPI responses for the error codes a view can return."""
    descriptions = {
        400: "Invalid input; `fields` names each bad field.",
        401: "Not signed in.",
        403: "Not allowed.",
        404: "Not found (or not yours).",
        409: "The GPUs are taken; `alternatives` lists the nearest free windows.",
        413: "The request body is too large.",
        429: "Too many attempts; retry later.",
    }
    return {
        code: OpenApiResponse(
            ConflictSerializer if code == 409 else ErrorSerializer, description=descriptions[code]
        )
        for code in codes
    }


class PaginatedApi(APIView):
    """A list view with the project's cursor pagination (and its schema)."""

    pagination_class = CursorPagination

    def paginate(
        self, request: Request, queryset: QuerySet[Any], serializer: type[serializers.Serializer[Any]]
    ) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(serializer(page, many=True).data)


def drf_datetime(value: datetime | None) -> str | None:
    """What DRF's ``DateTimeField`` renders (ISO 8601 in the current time zone, ``Z`` for UTC)."""
    if value is None:
        return None
    text = value.astimezone(timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


_validators: dict[type[serializers.Serializer[Any]], serializers.Serializer[Any]] = {}


def validate(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    """``serializer_class(data=data)`` + ``is_valid(raise_exception=True)`` + ``validated_data``,
    without building the serializer and deep-copying its fields on every request.

    One unbound instance per class is reused: validation keeps no state on the serializer
    (only ``fields``, built once), so this is safe across requests and threads.  For input
    serializers without ``context`` or ``instance``.  Raises the same 400 (``ValidationError``
    with a field -> messages dict).
    """
    serializer = _validators.get(serializer_class)
    if serializer is None:
        serializer = _validators.setdefault(serializer_class, serializer_class())
    validated: dict[str, Any] = serializer.run_validation(data)
    return validated


def csv_values(raw: str | None, *, allowed: Sequence[str], name: str) -> list[str]:
    """Parse ``a,b`` query values against allowed choices (400 on an unknown one)."""
    if not raw:
        return []
    values = [v.strip() for v in raw.split(",") if v.strip()]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise serializers.ValidationError({name: [f"Unknown value(s): {', '.join(unknown)}."]})
    return values


@extend_schema(exclude=True)
class NotFoundApi(APIView):
    """Answers every unknown path under the API with the API's own 404 body."""

    permission_classes: list[Any] = []
    authentication_classes: list[Any] = []

    def _not_found(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # This catch-all outranks APPEND_SLASH's redirect, so point at the slashed URL instead.
        if not request.path.endswith("/"):
            try:
                match = resolve(request.path + "/")
            except Resolver404:
                match = None
            if match is not None and match.url_name != "not-found":
                raise exceptions.NotFound(f"No such API endpoint; did you mean {request.path}/ ?")
        raise exceptions.NotFound("No such API endpoint.")

    get = post = put = patch = delete = _not_found
