"""Invariants the database itself enforces, tried with raw writes that bypass the services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.postgres.fields.ranges import DateTimeTZRange
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduling.engine import types as engine_types
from scheduling.models import Allocation, Booking, Gpu, Job, Node
from tests.factories import AllocationFactory, BookingFactory, JobFactory

pytestmark = pytest.mark.django_db


# One base instant for the whole module: two calls to ``timezone.now()`` a second apart would
# shift one period against the other (back-to-back periods would then overlap).
_BASE = timezone.now().replace(microsecond=0)


def _period(start_h: float, end_h: float | None) -> DateTimeTZRange:
    base = _BASE
    upper = None if end_h is None else base + timedelta(hours=end_h)
    return DateTimeTZRange(base + timedelta(hours=start_h), upper, "[)")


def test_exclusion_constraint_rejects_raw_overlapping_sql_insert(nodes):
    gpu = Gpu.objects.order_by("id").first()
    AllocationFactory(gpu=gpu, period=_period(0, 2))
    job = JobFactory()
    with (
        pytest.raises(IntegrityError, match="allocation_no_gpu_overlap"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            """
                INSERT INTO scheduling_allocation (gpu_id, job_id, period, is_preemptible, state, created_at)
                VALUES (%s, %s, tstzrange(now() + interval '1 hour', now() + interval '3 hours', '[)'),
                        false, 'active', now())
                """,
            [gpu.pk, job.pk],
        )
    assert Allocation.objects.count() == 1


@pytest.mark.parametrize(
    ("existing", "new", "is_allowed"),
    [
        ((0, 2), (1, 3), False),  # overlap
        ((0, 2), (0.5, 1), False),  # contained
        ((0, 2), (2, 3), True),  # back to back: half-open periods do not touch
        ((0, None), (100, 101), False),  # an open-ended running job blocks the whole future
        ((2, 3), (0, 2), True),
    ],
)
def test_exclusion_constraint_on_orm_inserts(nodes, existing, new, is_allowed):
    gpu = Gpu.objects.order_by("id").first()
    AllocationFactory(gpu=gpu, period=_period(*existing))
    if is_allowed:
        AllocationFactory(gpu=gpu, period=_period(*new))
        assert Allocation.objects.count() == 2
    else:
        with pytest.raises(IntegrityError), transaction.atomic():
            AllocationFactory(gpu=gpu, period=_period(*new))
        assert Allocation.objects.count() == 1


def test_other_gpus_and_released_allocations_do_not_block(nodes):
    first, second = Gpu.objects.order_by("id")[:2]
    released = AllocationFactory(gpu=first, period=_period(0, 2), state=Allocation.State.RELEASED)
    AllocationFactory(gpu=first, period=_period(0, 2))  # overlaps only the released one
    AllocationFactory(gpu=second, period=_period(0, 2))  # same period, other GPU
    assert Allocation.objects.exclude(pk=released.pk).count() == 2
    # Bringing the released one back would double-book: refused.
    released.state = Allocation.State.ACTIVE
    with pytest.raises(IntegrityError), transaction.atomic():
        released.save()


def test_allocation_has_exactly_one_holder(nodes, cluster, a100, project, member):
    gpu = Gpu.objects.order_by("id").first()
    booking = BookingFactory(cluster=cluster, gpu_type=a100, project=project, user=member)
    job = JobFactory(cluster=cluster, project=project, user=member)
    with pytest.raises(IntegrityError, match="allocation_exactly_one_holder"), transaction.atomic():
        Allocation.objects.create(gpu=gpu, booking=booking, job=job, period=_period(0, 1))
    with pytest.raises(IntegrityError, match="allocation_exactly_one_holder"), transaction.atomic():
        Allocation.objects.create(gpu=gpu, period=_period(0, 1))


def test_empty_period_is_refused(nodes):
    gpu = Gpu.objects.order_by("id").first()
    with pytest.raises(IntegrityError, match="allocation_period_not_empty"), transaction.atomic():
        AllocationFactory(gpu=gpu, period=_period(1, 1))


def test_booking_window_and_count_checks(cluster, a100, project, member):
    start = timezone.now() + timedelta(hours=1)
    with pytest.raises(IntegrityError, match="booking_end_after_start"), transaction.atomic():
        BookingFactory(
            cluster=cluster, gpu_type=a100, project=project, user=member, start_at=start, end_at=start
        )
    with pytest.raises(IntegrityError, match="booking_gpu_count_positive"), transaction.atomic():
        BookingFactory(cluster=cluster, gpu_type=a100, project=project, user=member, gpu_count=0)
    assert not Booking.objects.exists()


def test_statuses_are_text_choices_that_mirror_the_engine():
    assert set(Job.PendingReason.values) - {""} == {r.value for r in engine_types.PendingReason}
    assert set(Node.Status.values) == {s.value for s in engine_types.NodeStatus}
    assert set(Job.Kind.values) == {k.value for k in engine_types.JobKind}
