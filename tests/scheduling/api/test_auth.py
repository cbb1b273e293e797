"""Who may see and change what through the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from scheduling.models import Booking
from scheduling.services import booking_create, job_submit
from tests.conftest import token_client
from tests.factories import MembershipFactory, ProjectFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def booking(member, project, a100, nodes, soon) -> Booking:
    return booking_create(
        member, project=project, gpu_type=a100, gpu_count=1, start_at=soon, end_at=soon + timedelta(hours=1)
    )


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/bookings/",
        "/api/v1/jobs/",
        "/api/v1/projects/",
        "/api/v1/me/",
        "/api/v1/clusters/",
        "/api/v1/gpu-types/",
        "/api/v1/availability/?gpu_type=A100&start=2030-01-01T00:00:00Z&end=2030-01-02T00:00:00Z",
    ],
)
def test_anonymous_is_refused(url):
    response = APIClient().get(url)
    assert response.status_code in (401, 403)
    assert "message" in response.json()


def test_bad_token_is_401():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert client.get("/api/v1/me/").status_code == 401


def test_another_users_booking_is_404(booking, outsider):
    client = token_client(outsider)
    url = f"/api/v1/bookings/{booking.pk}/"
    assert client.get(url).status_code == 404
    assert client.post(f"{url}cancel/").status_code == 404
    assert client.delete(url).status_code == 404
    assert client.post(f"{url}extend/", {"end_at": "2030-01-01T00:00:00Z"}, format="json").status_code == 404
    assert client.get("/api/v1/bookings/").json()["results"] == []
    assert Booking.objects.get(pk=booking.pk).status == Booking.Status.CONFIRMED


def test_a_peer_in_the_same_project_cannot_see_a_members_booking(booking, project):
    peer = MembershipFactory(project=project).user
    assert token_client(peer).get(f"/api/v1/bookings/{booking.pk}/").status_code == 404


def test_manager_sees_and_cancels_project_bookings(booking, manager):
    client = token_client(manager)
    assert client.get(f"/api/v1/bookings/{booking.pk}/").status_code == 200
    assert [b["id"] for b in client.get("/api/v1/bookings/").json()["results"]] == [booking.pk]
    assert client.post(f"/api/v1/bookings/{booking.pk}/cancel/").status_code == 200


def test_staff_see_everything_but_researchers_not_the_audit_log(booking, staff, member):
    staff_client = token_client(staff)
    assert staff_client.get(f"/api/v1/bookings/{booking.pk}/").status_code == 200
    events = staff_client.get("/api/v1/audit-events/", {"entity_type": "booking"})
    assert events.status_code == 200
    assert [e["verb"] for e in events.json()["results"]] == ["booking.create"]
    refused = token_client(member).get("/api/v1/audit-events/")
    assert refused.status_code == 403
    assert refused.json()["message"]


def test_booking_for_a_project_you_are_not_in_is_403(outsider, project, a100, nodes, soon):
    response = token_client(outsider).post(
        "/api/v1/bookings/",
        {
            "project": project.slug,
            "gpu_type": "A100",
            "gpu_count": 1,
            "start_at": soon.isoformat(),
            "end_at": (soon + timedelta(hours=1)).isoformat(),
        },
        format="json",
    )
    assert response.status_code == 403
    assert not Booking.objects.exists()


def test_project_you_are_not_in_is_404(outsider, project):
    client = token_client(outsider)
    assert client.get(f"/api/v1/projects/{project.slug}/").status_code == 404
    slugs = [p["slug"] for p in client.get("/api/v1/projects/").json()["results"]]
    assert project.slug not in slugs


def test_another_users_job_is_404(member, project, nodes, outsider):
    job = job_submit(member, project=project, name="train", gpu_count=1)
    assert token_client(outsider).get(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert token_client(outsider).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 404


def test_session_writes_need_csrf(member, project, nodes, soon):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(member)
    body = {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": 1,
        "start_at": soon.isoformat(),
        "end_at": (soon + timedelta(hours=1)).isoformat(),
    }
    assert client.get("/api/v1/me/").status_code == 200  # reads are fine with a session
    refused = client.post("/api/v1/bookings/", body, format="json")
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["message"]
    assert not Booking.objects.exists()

    # With the token from the CSRF cookie the same write goes through.
    client.get("/admin/login/")  # any page that sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    accepted = client.post("/api/v1/bookings/", body, format="json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 201, accepted.content


def test_me_lists_memberships(member, project):
    other = ProjectFactory(slug="nlp")
    MembershipFactory(user=member, project=other, role="manager")
    data = token_client(member).get("/api/v1/me/").json()
    assert data["username"] == member.username
    assert {(m["project"], m["role"]) for m in data["memberships"]} == {
        ("vision", "member"),
        ("nlp", "manager"),
    }
