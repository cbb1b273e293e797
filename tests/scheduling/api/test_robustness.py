"""Inputs found by fuzzing the API with schemathesis: each once produced a 500 or a non-JSON error."""

from __future__ import annotations

import json

import pytest

from scheduling.models import Booking, Job

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "body",
    [
        # PostgreSQL cannot store NUL characters: this used to reach the slug lookup and 500.
        '{"project": "vision", "gpu_type": "A\\u0000100", "gpu_count": 1,'
        ' "start_at": "2030-01-01T00:00:00Z", "end_at": "2030-01-01T01:00:00Z"}',
        # A lone UTF-16 surrogate is valid JSON but not encodable as UTF-8.
        '{"project": "vision", "gpu_type": "\\udb05", "gpu_count": 1,'
        ' "start_at": "2030-01-01T00:00:00Z", "end_at": "2030-01-01T01:00:00Z"}',
        # ... also in keys and in nested values that end up in jsonb.
        '{"\\ud804": [], "project": "vision"}',
    ],
)
def test_unstorable_strings_are_400(member_client, nodes, body):
    response = member_client.generic("POST", "/api/v1/bookings/", body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["message"]
    assert not Booking.objects.exists()


def test_nul_in_job_payload_is_400(member_client, project, nodes):
    body = {"name": "x", "project": "vision", "gpu_count": 1, "payload": {"env": {"A\u0000": "1"}}}
    response = member_client.generic(
        "POST", "/api/v1/jobs/", json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/bookings/null,null/",
        "/api/v1/jobs/abc/cancel/",
        "/api/v1/nothing-here/",
        "/api/v1/bookings",
        "/api/v1/projects/a%0Ab/",
    ],
)
def test_unknown_api_paths_are_json_404(member_client, url):
    response = member_client.get(url)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["message"]


def test_missing_slash_points_at_the_right_url(member_client):
    assert "/api/v1/bookings/" in member_client.get("/api/v1/bookings").json()["message"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": ".exe"}, "cursor"),
        ({"page_size": "-4"}, "page_size"),
        ({"page_size": "many"}, "page_size"),
    ],
)
def test_bad_pagination_is_400(member_client, params, field):
    response = member_client.get("/api/v1/jobs/", params)
    assert response.status_code == 400
    assert field in response.json()["fields"]


def test_page_size_and_cursor_walk_every_row_once(member_client, member, project, nodes):
    from scheduling.services import job_submit

    ids = {job_submit(member, project=project, name=f"j{i}", gpu_count=1).pk for i in range(7)}
    seen: list[int] = []
    url = "/api/v1/jobs/?page_size=3"
    while url:
        data = member_client.get(url).json()
        seen.extend(j["id"] for j in data["results"])
        url = data["next"]
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(ids)


def test_blank_filters_mean_no_filter(member_client):
    assert member_client.get("/api/v1/bookings/", {"status": "", "project": ""}).status_code == 200


def test_urls_still_reverse_with_the_catch_all():
    from django.urls import reverse

    assert reverse("api:booking-detail", args=[3]) == "/api/v1/bookings/3/"
    assert reverse("admin:index") == "/admin/"
