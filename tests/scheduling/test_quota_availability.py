"""Availability for the chosen project: free GPUs and what its quota lets it book (booking box and
API), and a box that keeps answering after a refused submit (real PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from portal.accounts.models import Project
from scheduling.models import Booking, GpuType, Node
from scheduling.services import booking_create
from tests.factories import ProjectFactory, QuotaFactory

pytestmark = pytest.mark.django_db

LOCAL = "%Y-%m-%dT%H:%M"


def _form(project: Project, *, start: datetime, gpus: int) -> dict[str, str]:
    return {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": str(gpus),
        "start_at": start.strftime(LOCAL),
        "duration_h": "2",
        "note": "",
    }


def test_box_says_what_the_quota_allows_and_keeps_its_state_after_a_refused_submit(
    client: Client, member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=1, borrow_limit_gpus=2)  # at most 3
    client.force_login(member)
    box = client.get(reverse("booking-availability"), _form(project, start=soon, gpus=5)).content.decode()
    assert "Over the quota" in box
    assert "at most 3" in box
    assert "Enough" not in box  # 8 GPUs are free, but the project may book only 3
    ok = client.get(reverse("booking-availability"), _form(project, start=soon, gpus=2)).content.decode()
    assert "Enough: 2 GPUs can be booked" in ok
    assert "up to 3" in ok

    refused = client.post(reverse("booking-new"), _form(project, start=soon, gpus=5))
    assert refused.status_code == 422
    page = refused.content.decode()
    assert "may hold at most 3" in page  # the service's own refusal
    assert "Fill in the GPU type" not in page  # the box did not reset
    assert "Over the quota" in page
    assert not Booking.objects.filter(user=member).exists()


def test_availability_api_answers_for_the_project(
    member: User, project: Project, nodes: list[Node], a100: GpuType, soon: datetime
) -> None:
    QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=2, borrow_limit_gpus=2)  # at most 4
    booking_create(
        member,
        project=project,
        gpu_type=a100,
        gpu_count=3,
        start_at=soon,
        end_at=soon + timedelta(hours=1),
    )
    api = APIClient()
    api.force_authenticate(member)
    params = {
        "gpu_type": "A100",
        "start": soon.isoformat(),
        "end": (soon + timedelta(hours=2)).isoformat(),
        "step": 3600,
    }
    plain = api.get("/api/v1/availability/", params)
    assert plain.status_code == 200
    assert "quota" not in plain.json()
    assert [s["free_gpus"] for s in plain.json()["slots"]] == [5, 8]
    mine = api.get("/api/v1/availability/", {**params, "project": project.slug}).json()
    assert mine["quota"] == {"project": project.slug, "max_gpus": 4, "booked_peak": 3, "bookable_gpus": 1}
    # another project's quota is not the member's business: 404, like any other's object
    other = ProjectFactory()
    assert api.get("/api/v1/availability/", {**params, "project": other.slug}).status_code == 404
