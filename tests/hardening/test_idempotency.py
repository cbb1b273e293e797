"""``Idempotency-Key`` on the API's writes (scheduling/api/idempotency.py), on real PostgreSQL.

A retry with the key of a stored write answers the stored status and body and writes nothing;
the same key with another request is a 422; concurrent requests with one key write once.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.accounts.models import Membership
from scheduling.models import AuditEvent, Booking, IdempotencyKey, Job
from scheduling.tasks import idempotency_keys_clean
from tests.conftest import token_client
from tests.factories import (
    ClusterFactory,
    GpuTypeFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
)

pytestmark = pytest.mark.django_db

KEY = "6f1d2c4e-0b7a-4c55-9a51-1e0c2f3b7d10"


def _booking_body(soon: Any, *, hours: int = 2, count: int = 1, note: str = "idem") -> dict[str, Any]:
    return {
        "project": "vision",
        "gpu_type": "A100",
        "gpu_count": count,
        "start_at": soon.isoformat(),
        "end_at": (soon + timedelta(hours=hours)).isoformat(),
        "note": note,
    }


def _post(client: APIClient, path: str, body: dict[str, Any] | None, key: str | None = KEY) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(path, body, format="json", **headers)


def test_a_retried_booking_gets_the_stored_answer_and_is_written_once(nodes, member_client, soon):
    first = _post(member_client, "/api/v1/bookings/", _booking_body(soon))
    assert first.status_code == 201, first.json()
    assert first["Idempotent-Replayed"] == "false"
    again = _post(member_client, "/api/v1/bookings/", _booking_body(soon))
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content  # byte for byte, key order included
    assert Booking.objects.count() == 1
    assert AuditEvent.objects.filter(verb="booking.create").count() == 1
    row = IdempotencyKey.objects.get()
    assert (row.key, row.method, row.path, row.status_code) == (KEY, "POST", "/api/v1/bookings/", 201)


def test_without_a_key_two_identical_posts_are_two_bookings(nodes, member_client, soon):
    for _ in range(2):
        answer = _post(member_client, "/api/v1/bookings/", _booking_body(soon), key=None)
        assert answer.status_code == 201
        assert "Idempotent-Replayed" not in answer
    assert Booking.objects.count() == 2
    assert not IdempotencyKey.objects.exists()


def test_the_same_key_with_another_body_or_path_is_a_422_and_writes_nothing(nodes, member_client, soon):
    assert _post(member_client, "/api/v1/bookings/", _booking_body(soon)).status_code == 201
    other_body = _post(member_client, "/api/v1/bookings/", _booking_body(soon, hours=3))
    assert other_body.status_code == 422
    data = other_body.json()
    assert set(data) == {"message", "fields"}
    assert "different request" in data["fields"]["Idempotency-Key"][0]
    job = {"name": "j", "project": "vision", "gpu_count": 1, "payload": {"command": "true"}}
    other_path = _post(member_client, "/api/v1/jobs/", job)
    assert other_path.status_code == 422, other_path.json()
    assert Booking.objects.count() == 1
    assert not Job.objects.exists()


def test_keys_are_per_user(nodes, project, member_client, soon):
    other = token_client(MembershipFactory(project=project, role=Membership.Role.MEMBER).user)
    assert _post(member_client, "/api/v1/bookings/", _booking_body(soon)).status_code == 201
    theirs = _post(other, "/api/v1/bookings/", _booking_body(soon))
    assert theirs.status_code == 201
    assert theirs["Idempotent-Replayed"] == "false"
    assert Booking.objects.count() == 2


def test_an_error_answer_is_not_stored_so_the_retry_runs_again(nodes, member_client, soon):
    blocker = _post(member_client, "/api/v1/bookings/", _booking_body(soon, count=8), key="blocker")
    assert blocker.status_code == 201
    refused = _post(member_client, "/api/v1/bookings/", _booking_body(soon))
    assert refused.status_code == 409
    assert "Idempotent-Replayed" not in refused
    assert not IdempotencyKey.objects.filter(key=KEY).exists()
    cancel = _post(member_client, f"/api/v1/bookings/{blocker.json()['id']}/cancel/", None, key="c1")
    assert cancel.status_code == 200
    retried = _post(member_client, "/api/v1/bookings/", _booking_body(soon))
    assert retried.status_code == 201
    assert retried["Idempotent-Replayed"] == "false"
    assert Booking.objects.filter(status=Booking.Status.CONFIRMED).count() == 1


def test_a_replayed_cancel_and_extend_answer_what_the_first_did(nodes, member_client, soon):
    booking_id = _post(member_client, "/api/v1/bookings/", _booking_body(soon), key="b").json()["id"]
    extend = {"end_at": (soon + timedelta(hours=4)).isoformat()}
    first = _post(member_client, f"/api/v1/bookings/{booking_id}/extend/", extend, key="e")
    assert first.status_code == 200, first.json()
    again = _post(member_client, f"/api/v1/bookings/{booking_id}/extend/", extend, key="e")
    assert (again.status_code, again.content, again["Idempotent-Replayed"]) == (200, first.content, "true")
    cancelled = member_client.delete(f"/api/v1/bookings/{booking_id}/", HTTP_IDEMPOTENCY_KEY="d")
    assert cancelled.status_code == 200
    replayed = member_client.delete(f"/api/v1/bookings/{booking_id}/", HTTP_IDEMPOTENCY_KEY="d")
    assert (replayed.status_code, replayed.content) == (200, cancelled.content)
    assert replayed["Idempotent-Replayed"] == "true"
    verbs = list(AuditEvent.objects.filter(entity_id=booking_id).values_list("verb", flat=True))
    assert sorted(verbs) == ["booking.cancel", "booking.create", "booking.extend"]
    # Without the key, a second cancel is the service's own answer (already cancelled).
    assert member_client.delete(f"/api/v1/bookings/{booking_id}/").status_code == 400


def test_a_replayed_job_submit_and_cancel_write_once(nodes, member_client):
    body = {"name": "train", "project": "vision", "gpu_count": 1, "payload": {"command": "python t.py"}}
    first = _post(member_client, "/api/v1/jobs/", body, key="j")
    assert first.status_code == 201, first.json()
    again = _post(member_client, "/api/v1/jobs/", body, key="j")
    assert (again.status_code, again.content, again["Idempotent-Replayed"]) == (201, first.content, "true")
    assert Job.objects.count() == 1
    job_id = first.json()["id"]
    cancel = _post(member_client, f"/api/v1/jobs/{job_id}/cancel/", None, key="jc")
    assert cancel.status_code == 200
    assert _post(member_client, f"/api/v1/jobs/{job_id}/cancel/", None, key="jc").content == cancel.content
    assert AuditEvent.objects.filter(entity_type="job", entity_id=job_id, verb="job.cancel").count() == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "clé", "two words"])
def test_a_malformed_key_is_a_400_naming_the_header(nodes, member_client, soon, key):
    answer = _post(member_client, "/api/v1/bookings/", _booking_body(soon), key=key)
    assert answer.status_code == 400
    assert "Idempotency-Key" in answer.json()["fields"]
    assert not Booking.objects.exists()


def test_an_expired_key_is_new_again_and_the_cleaner_deletes_expired_rows(
    nodes, member_client, soon, settings
):
    assert _post(member_client, "/api/v1/bookings/", _booking_body(soon)).status_code == 201
    old = timezone.now() - timedelta(seconds=settings.BERTH_IDEMPOTENCY_TTL_S + 60)
    IdempotencyKey.objects.update(created_at=old)
    again = _post(member_client, "/api/v1/bookings/", _booking_body(soon))
    assert again["Idempotent-Replayed"] == "false"
    assert Booking.objects.count() == 2
    assert _post(member_client, "/api/v1/bookings/", _booking_body(soon), key="stale").status_code == 201
    IdempotencyKey.objects.filter(key="stale").update(created_at=old)
    assert idempotency_keys_clean() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == [KEY]


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_write_once():
    """Eight threads send the same booking with the same key at once: one booking, eight 201s
    with its id, seven of them replays (each thread has its own PostgreSQL connection)."""
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="alpha")
    for i in range(2):
        NodeFactory(cluster=cluster, gpu_type=a100, name=f"a{i}", gpu_count=4)
    project = ProjectFactory(slug="vision")
    user = MembershipFactory(project=project, role=Membership.Role.MEMBER).user
    token = Token.objects.create(user=user).key
    soon = (timezone.now() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    results: list[Any] = [None] * threads_n

    def run(i: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        try:
            barrier.wait(timeout=60)
            answer = _post(client, "/api/v1/bookings/", _booking_body(soon))
            results[i] = (answer.status_code, answer.json(), answer["Idempotent-Replayed"])
        except Exception as exc:  # asserted below
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not [r for r in results if not isinstance(r, tuple)], results
    assert {r[0] for r in results} == {201}
    assert len({r[1]["id"] for r in results}) == 1
    assert sorted(r[2] for r in results) == ["false"] + ["true"] * (threads_n - 1)
    assert Booking.objects.count() == 1
    assert AuditEvent.objects.filter(verb="booking.create").count() == 1


def test_the_schema_documents_the_header_and_the_422(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    writes = [
        ("/api/v1/bookings/", "post"),
        ("/api/v1/bookings/{booking_id}/", "delete"),
        ("/api/v1/bookings/{booking_id}/cancel/", "post"),
        ("/api/v1/bookings/{booking_id}/extend/", "post"),
        ("/api/v1/bookings/{booking_id}/end/", "post"),
        ("/api/v1/jobs/", "post"),
        ("/api/v1/jobs/{job_id}/", "delete"),
        ("/api/v1/jobs/{job_id}/cancel/", "post"),
    ]
    for path, method in writes:
        operation = schema["paths"][path][method]
        headers = [p["name"] for p in operation.get("parameters", []) if p["in"] == "header"]
        assert "Idempotency-Key" in headers, (path, method)
        assert "422" in operation["responses"], (path, method)
        ok = next(code for code in operation["responses"] if code.startswith("2"))
        assert "Idempotent-Replayed" in operation["responses"][ok].get("headers", {}), (path, method)
    listing = schema["paths"]["/api/v1/bookings/"]["get"]
    assert "Idempotency-Key" not in [p["name"] for p in listing.get("parameters", [])]
    assert "422" not in listing["responses"]
