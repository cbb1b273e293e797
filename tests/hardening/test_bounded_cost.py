"""Bounded cost of what an attacker can send: refused bookings (the alternatives search) on a full
calendar, crafted cursors, deeply nested JSON, pending-job limits."""

from __future__ import annotations

import base64
import random
import statistics
import time
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.utils import timezone

from scheduling.models import Allocation, Booking, Gpu, Node
from scheduling.selectors import booking_alternatives
from tests.conftest import token_client
from tests.factories import NodeFactory

pytestmark = pytest.mark.django_db


def _fill_calendar(*, cluster, gpu_type, user, project, bookings: int, seed: int = 7) -> None:
    """``bookings`` non-overlapping bookings (1-8 GPUs of one node, 1-8 h, small gaps) from now on,
    written in bulk (the service would take minutes; the search reads only the rows)."""
    rng = random.Random(seed)
    nodes = list(Node.objects.filter(cluster=cluster, gpu_type=gpu_type).order_by("id"))
    gpus = {
        n.pk: list(Gpu.objects.filter(node=n).order_by("index").values_list("id", flat=True)) for n in nodes
    }
    free_at = {g: timezone.now() for ids in gpus.values() for g in ids}
    rows, allocations = [], []
    for _ in range(bookings):
        node = rng.choice(nodes)
        count = rng.randint(1, len(gpus[node.pk]))
        chosen = rng.sample(gpus[node.pk], count)
        start = max(free_at[g] for g in chosen) + timedelta(minutes=rng.choice([0, 0, 30, 60]))
        end = start + timedelta(hours=rng.randint(1, 8))
        for g in chosen:
            free_at[g] = end
        rows.append(
            Booking(
                user=user,
                project=project,
                cluster=cluster,
                gpu_type=gpu_type,
                gpu_count=count,
                start_at=start,
                end_at=end,
            )
        )
        allocations.append((chosen, start, end))
    Booking.objects.bulk_create(rows, batch_size=2000)
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

    Allocation.objects.bulk_create(
        [
            Allocation(gpu_id=g, booking=b, period=DateTimeTZRange(start, end, "[)"))
            for b, (chosen, start, end) in zip(rows, allocations, strict=True)
            for g in chosen
        ],
        batch_size=5000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE scheduling_allocation")


@pytest.mark.slow
def test_alternatives_search_is_bounded_on_a_full_calendar(settings, cluster, a100, member, project):
    for i in range(32):
        NodeFactory(cluster=cluster, gpu_type=a100, name=f"n{i}", gpu_count=8)
    _fill_calendar(cluster=cluster, gpu_type=a100, user=member, project=project, bookings=20_000)
    assert Booking.objects.count() == 20_000
    import sys

    sys.path.insert(0, "/tmp")
    import prof_alt

    prof_alt.prof(a100)
    soon = timezone.now() + timedelta(hours=1)
    times = []
    answers = []
    for count in (1, 4, 8):
        for hours in (1, 8, 48):
            for _ in range(4):
                t0 = time.perf_counter()
                found = booking_alternatives(
                    gpu_type=a100, gpu_count=count, start_at=soon, end_at=soon + timedelta(hours=hours)
                )
                times.append((time.perf_counter() - t0) * 1000)
                answers.append((count, hours, found))
    times.sort()
    p99 = times[int(0.99 * (len(times) - 1))]
    print(f"alternatives on 20,000 bookings: p50 {statistics.median(times):.1f} ms, p99 {p99:.1f} ms")
    # Every window offered is really free: no blocking allocation overlaps it on enough GPUs.
    for count, hours, found in answers:
        for alt in found:
            busy = (
                Allocation.objects.filter(
                    gpu__node__cluster=cluster, period__overlap=(alt.start_at, alt.end_at)
                )
                .exclude(state=Allocation.State.RELEASED)
                .values("gpu_id")
                .distinct()
                .count()
            )
            assert 256 - busy >= count, (count, hours, alt)
    # The target is 50 ms on a quiet machine (docs/operations.md); 2 shared cores get slack.
    assert p99 <= 4 * 50


def test_alternatives_stop_where_the_rows_read_stop(settings, cluster, a100, member, project):
    """With a row budget smaller than the calendar, the answer is still a really free window."""
    NodeFactory(cluster=cluster, gpu_type=a100, name="n0", gpu_count=2)
    _fill_calendar(cluster=cluster, gpu_type=a100, user=member, project=project, bookings=200)
    soon = timezone.now() + timedelta(minutes=10)
    full = booking_alternatives(gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=2))
    settings.BERTH_ALTERNATIVES_MAX_ROWS = 20
    bounded = booking_alternatives(
        gpu_type=a100, gpu_count=2, start_at=soon, end_at=soon + timedelta(hours=2)
    )
    # Either the same nearest window or none (it lay beyond what 20 rows cover), never a taken one.
    assert bounded in ([], full[:1]) or bounded == full
    for alt in bounded:
        assert not Allocation.objects.filter(period__overlap=(alt.start_at, alt.end_at)).exists()
