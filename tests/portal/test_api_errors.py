"""The one API exception handler: every error body is {"message", "fields"}."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.http import Http404
from rest_framework import exceptions

from portal.api import exception_handler
from scheduling.selectors import Alternative
from scheduling.services import BookingConflictError


def _handle(exc: Exception):
    response = exception_handler(exc, {})
    assert response is not None
    return response.status_code, response.data


def test_django_validation_errors_keep_their_fields():
    code, data = _handle(ValidationError({"end_at": ["The end must be after the start."]}))
    assert (code, data["fields"]) == (400, {"end_at": ["The end must be after the start."]})
    code, data = _handle(ValidationError("Something is off."))
    assert (code, data["fields"]) == (400, {"non_field_errors": ["Something is off."]})


def test_drf_nested_errors_are_flattened_to_message_lists():
    code, data = _handle(
        exceptions.ValidationError({"payload": {"env": ["Not a string."]}, "gpu_count": "Bad."})
    )
    assert code == 400
    assert data["fields"] == {"payload": {"env": ["Not a string."]}, "gpu_count": ["Bad."]}


def test_other_errors():
    assert _handle(Http404("x")) == (404, {"message": "Not found.", "fields": {}})
    code, data = _handle(PermissionDenied("You are not a member of this project."))
    assert (code, data["message"]) == (403, "You are not a member of this project.")
    assert _handle(RequestDataTooBig())[0] == 413
    # A real bug is still a 500 (and logged), in the documented shape, not Django's HTML page.
    internal = {"message": "Internal error; it has been logged.", "fields": {}}
    assert _handle(RuntimeError("boom")) == (500, internal)


def test_database_errors_are_503_with_retry_after():
    from django.db import OperationalError

    response = exception_handler(OperationalError("connection refused"), {})
    assert response is not None
    assert response.status_code == 503
    assert response["Retry-After"].isdigit()
    assert set(response.data) == {"message", "fields"}


def test_conflict_carries_alternatives_in_api_datetime_format():
    at = datetime(2030, 1, 1, 9, tzinfo=UTC)
    alternative = Alternative("alpha", "A100", 2, at, at.replace(hour=11))
    code, data = _handle(
        BookingConflictError("Taken.", alternatives=[alternative], fields={"start_at": ["x"]})
    )
    assert code == 409
    assert data == {
        "message": "Taken.",
        "fields": {"start_at": ["x"]},
        "alternatives": [
            {
                "cluster": "alpha",
                "gpu_type": "A100",
                "gpu_count": 2,
                "start_at": "2030-01-01T09:00:00Z",
                "end_at": "2030-01-01T11:00:00Z",
            }
        ],
    }


def test_errors_built_outside_drf_are_json_under_the_api(db):
    """Django's own 400 (a Host the portal does not serve) is HTML elsewhere, JSON under /api/."""
    from django.test import Client

    response = Client(HTTP_HOST="evil.example").get("/api/v1/me/")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"message": "Bad request.", "fields": {}}
    page = Client(HTTP_HOST="evil.example").get("/login/")
    assert page.status_code == 400
    assert not page["Content-Type"].startswith("application/json")
