"""The OpenAPI schema validates with no warnings, and list endpoints have query-count bounds."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
import yaml
from django.core.management import call_command

from scheduling.services import booking_create, job_submit
from tests.conftest import token_client
from tests.factories import MembershipFactory, ProjectFactory, QuotaFactory

pytestmark = pytest.mark.django_db


def test_schema_validates_without_warnings():
    out = io.StringIO()
    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out)
    schema = yaml.safe_load(out.getvalue())
    paths = schema["paths"]
    assert "/api/v1/bookings/" in paths
    assert {"get", "post"} <= set(paths["/api/v1/bookings/"])
    create = paths["/api/v1/bookings/"]["post"]
    assert "409" in create["responses"]
    # The errors any operation can answer are listed, in the one error shape.
    assert {"413", "414", "415", "429", "503"} <= set(create["responses"])
    for path, operations in paths.items():
        for method, operation in operations.items():
            assert {"414", "503"} <= set(operation["responses"]), (path, method)
            if method in ("post", "put", "patch"):
                assert {"413", "415"} <= set(operation["responses"]), (path, method)
    error = create["responses"]["503"]["content"]["application/json"]["schema"]["$ref"]
    assert error.endswith("/Error")
    booking = schema["components"]["schemas"]["BookingOutput"]["properties"]
    assert booking["start_at"]["format"] == "date-time"
    assert booking["end_at"]["format"] == "date-time"


def test_docs_and_schema_are_served(member_client):
    assert member_client.get("/api/schema/").status_code == 200
    docs = member_client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    # Swagger UI comes from our static files: nothing is fetched from a CDN at run time.
    assert "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()


def _fill(member, project, a100, soon, count: int) -> None:
    for i in range(count):
        start = soon + timedelta(hours=i)
        booking_create(
            member,
            project=project,
            gpu_type=a100,
            gpu_count=2,
            start_at=start,
            end_at=start + timedelta(hours=1),
        )
        job_submit(member, project=project, name=f"job-{i}", gpu_count=1, gpu_type=a100)


@pytest.mark.parametrize("count", [1, 12])
def test_list_query_counts_do_not_grow_with_rows(
    member, project, a100, nodes, soon, count, django_assert_max_num_queries
):
    _fill(member, project, a100, soon, count)
    other = ProjectFactory(slug="nlp")
    MembershipFactory(user=member, project=other)
    QuotaFactory(project=project, gpu_type=a100)
    client = token_client(member)
    # Token lookup (1) + the page (1) + prefetched GPUs (1), whatever the number of rows.
    with django_assert_max_num_queries(3):
        assert len(client.get("/api/v1/bookings/").json()["results"]) == count
    with django_assert_max_num_queries(2):
        assert len(client.get("/api/v1/jobs/").json()["results"]) == count
    with django_assert_max_num_queries(3):
        assert len(client.get("/api/v1/projects/").json()["results"]) == 2
    with django_assert_max_num_queries(3):
        client.get("/api/v1/clusters/")
    with django_assert_max_num_queries(2):
        client.get("/api/v1/me/")
    # Token lookup + one query for capacity and allocations together.
    with django_assert_max_num_queries(2):
        response = client.get(
            "/api/v1/availability/",
            {"gpu_type": "A100", "start": soon.isoformat(), "end": (soon + timedelta(days=2)).isoformat()},
        )
        assert response.status_code == 200
