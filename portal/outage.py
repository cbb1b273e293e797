"""Answers when a dependency is down, and JSON errors everywhere under the API.

- PostgreSQL unreachable (``OperationalError``/``InterfaceError`` from the driver): the API answers
  ``503 {"message", "fields"}`` with ``Retry-After``; pages answer a plain maintenance page
  (503, ``Retry-After``), rendered without the database, a request context or a traceback.
  This holds in every settings mode: a view's exception is answered in ``process_exception``;
  one raised elsewhere (a middleware, the session save after the view) reaches Django's own
  500 handler (the debug page under ``DEBUG``), which this middleware, outermost, replaces.
- Any other error answer under ``/api/`` that is not JSON (Django's own 400 for a bad host, a
  413 or 500 built outside DRF) is rewritten as ``{"message", "fields"}`` with its status and
  headers kept, so API clients parse one error shape whatever failed.

The recovery needs no restart: ``CONN_HEALTH_CHECKS`` makes the next request open a fresh
connection once PostgreSQL answers again.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views.debug import SafeExceptionReporterFilter

logger = logging.getLogger(__name__)

DATABASE_DOWN_ERRORS = (OperationalError, InterfaceError)
_DOWN_FLAG = "_berth_database_down"
_API_PREFIX = "/api/"


def is_database_down(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says PostgreSQL cannot be reached or used right now."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, DATABASE_DOWN_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def describe_database_error(exc: BaseException) -> str:
    """One log line for a database error: the driver's class, SQLSTATE and first message line
    (no parameters, no connection string), so a 503 in the logs says what failed."""
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None) or "-"
    first_line = (str(cause).strip().splitlines() or [""])[0][:200]
    return f"{type(cause).__name__} (SQLSTATE {sqlstate}): {first_line}"


def database_down_response(request: HttpRequest) -> HttpResponse:
    """503 with ``Retry-After``: JSON under the API, the maintenance page elsewhere."""
    retry_after = str(settings.BERTH_OUTAGE_RETRY_AFTER_S)
    response: HttpResponse
    if request.path_info.startswith(_API_PREFIX):
        response = JsonResponse(
            {
                "message": "The service is briefly unavailable (its database is unreachable); retry shortly.",
                "fields": {},
            },
            status=503,
        )
    else:
        # No request context: context processors would read the user (the database).
        response = HttpResponse(
            render_to_string("maintenance.html", {"retry_after_s": retry_after}),
            status=503,
            content_type="text/html; charset=utf-8",
        )
    response["Retry-After"] = retry_after
    response["Cache-Control"] = "no-store"
    return response


@receiver(got_request_exception, dispatch_uid="berth-outage-flag")
def _flag_database_down(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """Django is about to build its 500 for an exception: remember whether the database caused it."""
    if request is not None and is_database_down(sys.exc_info()[1]):
        setattr(request, _DOWN_FLAG, True)


def _is_json(response: HttpResponse) -> bool:
    return str(response.get("Content-Type", "")).startswith("application/json")


def _as_json_error(response: HttpResponse) -> HttpResponse:
    message = response.reason_phrase or "Request failed."
    if response.status_code == 400:
        message = "Bad request."
    elif response.status_code >= 500:
        message = "Internal error; it has been logged."
    replacement = JsonResponse({"message": message, "fields": {}}, status=response.status_code)
    for header in ("Retry-After", "Allow", "Vary"):
        if header in response:
            replacement[header] = response[header]
    return replacement


class OutageMiddleware:
    """Outermost middleware: the 503 for a database outage and JSON errors under the API."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if getattr(request, _DOWN_FLAG, False):
            return database_down_response(request)
        if (
            request.path_info.startswith(_API_PREFIX)
            and response.status_code >= 400
            and not _is_json(response)
            and not getattr(response, "streaming", False)
        ):
            return _as_json_error(response)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if is_database_down(exception):
            logger.warning(
                "database unreachable: %s %s answered 503: %s",
                request.method,
                request.path_info,
                describe_database_error(exception),
            )
            return database_down_response(request)
        return None


class ExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, also hiding settings that carry credentials in a URL (``REDIS_URL``,
    ``CELERY_BROKER_URL``, ``DATABASE_URL``) from the debug page and error mails."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN|BROKER|BACKEND|LOCATION|DATABASE",
        flags=re.I,
    )
