"""Bookings through the REST API: happy paths, 400s with field messages, 409 with alternatives."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.models import Allocation, AuditEvent, Booking

pytestmark = pytest.mark.django_db

URL = "/api/v1/bookings/"


def _body(project_, soon, **overrides):
    body = {
        "project": project_.slug,
        "gpu_type": "A100",
        "gpu_count": 2,
        "start_at": soon.isoformat(),
        "end_at": (soon + timedelta(hours=2)).isoformat(),
        "note": "debugging the data loader",
    }
    body.update(overrides)
    return body


def _assert_nothing_written() -> None:
    assert not Booking.objects.exists()
    assert not Allocation.objects.exists()
    assert not AuditEvent.objects.exists()


def test_create_retrieve_list(member_client, member, project, nodes, soon):
    response = member_client.post(URL, _body(project, soon), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["user"] == member.username
    assert data["project"] == "vision"
    assert data["cluster"] == "alpha"
    assert data["gpu_count"] == 2
    assert len(data["gpu_ids"]) == 2
    assert [g["id"] for g in data["gpus"]] == data["gpu_ids"]
    assert {g["node"] for g in data["gpus"]} <= {"a0", "a1"}
    assert data["status"] == "confirmed"

    detail = member_client.get(f"{URL}{data['id']}/")
    assert detail.status_code == 200
    assert detail.json()["gpu_ids"] == data["gpu_ids"]

    listing = member_client.get(URL)
    assert listing.status_code == 200
    assert [b["id"] for b in listing.json()["results"]] == [data["id"]]
    event = AuditEvent.objects.get(entity_type="booking", entity_id=data["id"])
    assert event.actor_label == AuditEvent.Actor.API
    assert event.actor_id == member.pk


def test_cancel_via_post_and_delete(member_client, project, nodes, soon):
    first = member_client.post(URL, _body(project, soon), format="json").json()
    second = member_client.post(URL, _body(project, soon, gpu_count=1), format="json").json()
    cancelled = member_client.post(f"{URL}{first['id']}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["gpu_ids"] == []  # released GPUs are not held any more
    deleted = member_client.delete(f"{URL}{second['id']}/")
    assert deleted.status_code == 200
    assert deleted.json()["status"] == "cancelled"
    again = member_client.post(f"{URL}{first['id']}/cancel/")
    assert again.status_code == 400
    assert "status" in again.json()["fields"]


def test_extend_and_end(member_client, project, nodes, soon):
    booking = member_client.post(URL, _body(project, soon), format="json").json()
    new_end = soon + timedelta(hours=5)
    response = member_client.post(
        f"{URL}{booking['id']}/extend/", {"end_at": new_end.isoformat()}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["end_at"] == new_end.isoformat().replace("+00:00", "Z")
    # Ending a booking that has not started is refused with a field message.
    ended = member_client.post(f"{URL}{booking['id']}/end/")
    assert ended.status_code == 400
    assert "status" in ended.json()["fields"]


@pytest.mark.parametrize("body", [{}, {"end_at": "tomorrow"}, {"end_at": "2099-01-01T00:00:00Z"}])
def test_extending_a_cancelled_booking_says_it_was_cancelled(member_client, project, nodes, soon, body):
    booking = member_client.post(URL, _body(project, soon), format="json").json()
    assert member_client.post(f"{URL}{booking['id']}/cancel/").status_code == 200
    response = member_client.post(f"{URL}{booking['id']}/extend/", body, format="json")
    assert response.status_code == 400
    data = response.json()
    # What is wrong is the booking, whatever the body: not "end_at: This field is required."
    assert set(data["fields"]) == {"status"}
    assert "cancelled, so it cannot be extended" in data["fields"]["status"][0]
    assert "end_at" not in json.dumps(data)


def test_end_a_running_booking(member_client, project, nodes):
    start = timezone.now()
    body = _body(project, start, end_at=(start + timedelta(hours=2)).isoformat())
    booking = member_client.post(URL, body, format="json").json()
    response = member_client.post(f"{URL}{booking['id']}/end/")
    assert response.status_code == 200
    assert response.json()["status"] == "completed"
    assert response.json()["ended_at"] is not None


def test_conflict_is_409_with_alternatives(member_client, project, nodes, soon):
    assert member_client.post(URL, _body(project, soon, gpu_count=8), format="json").status_code == 201
    response = member_client.post(URL, _body(project, soon, gpu_count=1), format="json")
    assert response.status_code == 409
    data = response.json()
    assert set(data) == {"message", "fields", "alternatives"}
    assert data["alternatives"][0]["gpu_type"] == "A100"
    assert data["alternatives"][0]["start_at"] == (soon + timedelta(hours=2)).isoformat().replace(
        "+00:00", "Z"
    )
    assert Booking.objects.count() == 1


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": -1}, "gpu_count"),
        ({"gpu_count": 10**12}, "gpu_count"),
        ({"gpu_count": 9}, "gpu_count"),  # more than the cluster has
        ({"gpu_count": "two"}, "gpu_count"),
        ({"gpu_count": None}, "gpu_count"),
        ({"gpu_type": "TPUv9"}, "gpu_type"),
        ({"gpu_type": ["A100"]}, "gpu_type"),
        ({"project": "no-such-project"}, "project"),
        ({"start_at": "yesterday"}, "start_at"),
        ({"start_at": "2020-01-01T00:00:00Z", "end_at": "2020-01-01T02:00:00Z"}, "start_at"),
        ({"start_at": "2031-01-01T00:00:00Z", "end_at": "2031-01-01T02:00:00Z"}, "start_at"),
        ({"start_at": "99999-01-01T00:00:00Z"}, "start_at"),
        ({"note": "x" * 501}, "note"),
        ({"cluster": "nowhere"}, "cluster"),
    ],
)
def test_bad_input_is_400_with_field_message(member_client, project, nodes, soon, overrides, field):
    response = member_client.post(URL, _body(project, soon, **overrides), format="json")
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["message"]
    assert field in data["fields"], data
    _assert_nothing_written()


def test_end_before_start_is_400(member_client, project, nodes, soon):
    body = _body(project, soon, end_at=(soon - timedelta(hours=1)).isoformat())
    response = member_client.post(URL, body, format="json")
    assert response.status_code == 400
    assert "end_at" in response.json()["fields"]
    _assert_nothing_written()


def test_missing_fields_are_named(member_client, nodes):
    response = member_client.post(URL, {}, format="json")
    assert response.status_code == 400
    assert {"project", "gpu_type", "gpu_count", "start_at", "end_at"} <= set(response.json()["fields"])


@pytest.mark.parametrize(
    "raw",
    [b"{", b"not json", b"[1, 2", b'{"gpu_count": 1,}', b"\xff\xfe\x00", b"null", b"[]", b'"a string"'],
)
def test_malformed_json_is_400(member_client, nodes, raw):
    response = member_client.generic("POST", URL, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert "message" in response.json()
    _assert_nothing_written()


def test_oversized_body_is_413(member_client, project, nodes, soon, settings):
    body = json.dumps(_body(project, soon, note="x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)))
    response = member_client.generic("POST", URL, body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["message"]
    _assert_nothing_written()


def test_wrong_content_type_is_415(member_client, project, nodes, soon):
    response = member_client.post(URL, _body(project, soon), format="multipart")
    assert response.status_code == 415
    _assert_nothing_written()


def test_list_filters_and_bad_filter(member_client, project, nodes, soon):
    first = member_client.post(URL, _body(project, soon), format="json").json()
    member_client.post(URL, _body(project, soon, gpu_count=1), format="json")
    member_client.post(f"{URL}{first['id']}/cancel/")
    cancelled = member_client.get(URL, {"status": "cancelled"}).json()["results"]
    assert [b["id"] for b in cancelled] == [first["id"]]
    assert len(member_client.get(URL, {"status": "confirmed,cancelled"}).json()["results"]) == 2
    bad = member_client.get(URL, {"status": "exploded"})
    assert bad.status_code == 400
    assert "status" in bad.json()["fields"]


def test_timezone_less_datetimes_are_refused_with_a_field_error(member_client, project, nodes, soon):
    naive = {
        "start_at": soon.replace(tzinfo=None).isoformat(),
        "end_at": (soon + timedelta(hours=1)).replace(tzinfo=None).isoformat(),
    }
    response = member_client.post(URL, _body(project, soon, **naive), format="json")
    assert response.status_code == 400
    assert "Give a timezone" in response.json()["fields"]["start_at"][0]
    _assert_nothing_written()


def test_a_booking_has_a_minimum_length(member_client, project, nodes, soon):
    body = _body(project, soon, end_at=(soon + timedelta(microseconds=1)).isoformat())
    response = member_client.post(URL, body, format="json")
    assert response.status_code == 400
    assert "at least" in response.json()["fields"]["end_at"][0]
    _assert_nothing_written()


def test_long_names_are_cut_short_in_errors(member_client, project, nodes, soon):
    response = member_client.post(URL, _body(project, soon, project="p" * 10_000), format="json")
    assert response.status_code == 400
    message = response.json()["fields"]["project"][0]
    assert len(message) < 200
    jobs = member_client.post(
        "/api/v1/jobs/",
        {"name": "j", "project": "q" * 10_000, "gpu_count": 1, "gpu_type": "A100", "requested_s": 60},
        format="json",
    )
    assert jobs.status_code == 400
    assert len(str(jobs.json()["fields"])) < 300
