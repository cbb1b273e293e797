"""Many people booking the same GPUs at the same instant: nobody is double-booked.

Real threads, real PostgreSQL connections (one per thread), committed transactions.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.accounts.models import Membership
from scheduling import services
from scheduling.models import Allocation, Booking
from scheduling.services import bookings, placement
from tests.factories import (
    ClusterFactory,
    GpuTypeFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    QuotaFactory,
)

THREADS = 50


def _overlapping_allocation_pairs() -> int:
    """Pairs of live allocations on the same GPU whose periods overlap, straight from SQL."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*)
              FROM scheduling_allocation a
              JOIN scheduling_allocation b
                ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
             WHERE a.state <> 'released' AND b.state <> 'released'
            """
        )
        return int(cursor.fetchone()[0])


def _run_at_once(work: list[Callable[[], Any]]) -> list[Any]:
    """Run every callable in its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[i] = work[i]()
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc
        finally:
            connections.close_all()  # this thread's connection, so the test database can be dropped

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a booking thread hung"
    return results


def _lab(gpus_per_node: int = 4, node_count: int = 2):
    a100 = GpuTypeFactory(name="A100")
    cluster = ClusterFactory(name="alpha")
    for i in range(node_count):
        NodeFactory(cluster=cluster, gpu_type=a100, name=f"a{i}", gpu_count=gpus_per_node)
    project = ProjectFactory(slug="vision")
    users = [MembershipFactory(project=project, role=Membership.Role.MEMBER).user for _ in range(THREADS)]
    return a100, project, users


def _hour_ahead() -> datetime:
    return (timezone.now() + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)


@pytest.mark.django_db(transaction=True)
def test_fifty_clients_racing_through_the_api_get_exactly_the_capacity():
    _, project, users = _lab()
    tokens = [Token.objects.create(user=u).key for u in users]
    start = _hour_ahead()
    body = {
        "project": project.slug,
        "gpu_type": "A100",
        "gpu_count": 2,
        "start_at": start.isoformat(),
        "end_at": (start + timedelta(hours=2)).isoformat(),
    }

    def book(token: str) -> tuple[int, dict[str, Any]]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
        response = client.post("/api/v1/bookings/", body, format="json")
        return response.status_code, response.json()

    results = _run_at_once([lambda t=t: book(t) for t in tokens])

    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    codes = sorted(code for code, _ in results)
    # 8 GPUs, 2 per booking: exactly four winners, everyone else told "taken" -- no 500s.
    assert codes.count(201) == 4
    assert codes.count(409) == THREADS - 4
    for code, data in results:
        if code == 409:
            assert data["alternatives"], data
            assert data["alternatives"][0]["start_at"] >= body["end_at"]
    assert Booking.objects.count() == 4
    assert Allocation.objects.count() == 8
    assert _overlapping_allocation_pairs() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("is_locking", [True, False], ids=["node-lock", "constraint-only"])
def test_random_overlapping_windows_never_double_book(monkeypatch, caplog, is_locking):
    """Staggered, partly overlapping windows of 1-3 GPUs from 50 threads at once.

    ``constraint-only`` turns our node lock into a no-op (monkeypatched) to stand for a
    writer that skips the locking protocol: the exclusion constraint alone must still hold.
    """
    caplog.set_level(logging.INFO, logger="scheduling.services")
    a100, project, users = _lab(gpus_per_node=4, node_count=3)
    if not is_locking:
        monkeypatch.setattr(bookings, "_lock_nodes", lambda **kwargs: None)
    rng = random.Random(7)
    start = _hour_ahead()
    requests = []
    for user in users:
        offset = timedelta(minutes=30 * rng.randrange(6))
        requests.append(
            (user, rng.randint(1, 3), start + offset, start + offset + timedelta(hours=rng.randint(1, 3)))
        )

    def book(user, gpu_count, s, e):
        try:
            booking = services.booking_create(
                user, project=project, gpu_type=a100, gpu_count=gpu_count, start_at=s, end_at=e
            )
        except services.BookingConflictError as exc:
            return ("conflict", exc.alternatives)
        return ("ok", booking.pk)

    results = _run_at_once([lambda r=r: book(*r) for r in requests])
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    granted = [r[1] for r in results if r[0] == "ok"]
    assert granted, "some booking must succeed"
    assert all(r[1] for r in results if r[0] == "conflict"), "every refusal offers an alternative"
    assert _overlapping_allocation_pairs() == 0
    retries = [r for r in caplog.records if "picking again" in r.getMessage()]
    if not is_locking:
        # The race really happened and the database refused the losers' inserts.
        assert retries
    else:
        assert not retries
    for booking in Booking.objects.filter(pk__in=granted):
        assert booking.allocations.count() == booking.gpu_count
    if is_locking:
        # Serialized placement is also complete: no refused request would have fit afterwards
        # in the exact window it asked for.
        for (_user, gpu_count, s, e), result in zip(requests, results, strict=True):
            if result[0] == "conflict":
                free = placement._free_nodes(
                    gpu_type=a100,
                    cluster_ids=[a100.nodes.first().cluster_id],
                    period=DateTimeTZRange(s, e, "[)"),
                )
                assert sum(len(n.gpu_ids) for n in free) < gpu_count


@pytest.mark.django_db(transaction=True)
def test_racing_members_cannot_exceed_their_project_quota_together():
    a100, project, users = _lab(gpus_per_node=4, node_count=6)  # 24 GPUs: capacity is not the limit
    QuotaFactory(project=project, gpu_type=a100, guaranteed_gpus=4, borrow_limit_gpus=2)  # at most 6
    start = _hour_ahead()

    def book(user):
        try:
            services.booking_create(
                user,
                project=project,
                gpu_type=a100,
                gpu_count=2,
                start_at=start,
                end_at=start + timedelta(hours=1),
            )
        except ValidationError as exc:
            return ("quota", exc.message_dict)
        return ("ok", None)

    results = _run_at_once([lambda u=u: book(u) for u in users[:20]])
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert [r[0] for r in results].count("ok") == 3
    assert all("gpu_count" in r[1] for r in results if r[0] == "quota")
    assert Allocation.objects.count() == 6
