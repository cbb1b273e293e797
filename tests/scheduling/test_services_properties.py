"""Random sequences of booking operations against real PostgreSQL (Hypothesis).

After every create / cancel / extend / end-early, whatever succeeded or was refused, the
invariants of DESIGN §3 must hold: no GPU held twice at any instant, every open booking holds
exactly its GPUs over exactly its window, nothing released still blocks, every change audited.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scheduling.models import Allocation, AuditEvent, Booking
from scheduling.services import (
    BookingConflictError,
    booking_cancel,
    booking_create,
    booking_end_early,
    booking_extend,
)

pytestmark = pytest.mark.django_db

SLOT = timedelta(minutes=30)

_create = st.tuples(
    st.just("create"), st.integers(1, 6), st.integers(0, 12), st.integers(1, 6)
)  # count, start slot, length in slots
_cancel = st.tuples(st.just("cancel"), st.integers(0, 20), st.just(0), st.just(0))
_extend = st.tuples(st.just("extend"), st.integers(0, 20), st.integers(1, 4), st.just(0))
_end = st.tuples(st.just("end"), st.integers(0, 20), st.integers(0, 6), st.just(0))
_operations = st.lists(st.one_of(_create, _create, _cancel, _extend, _end), min_size=1, max_size=12)


def _overlapping_pairs() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM scheduling_allocation a JOIN scheduling_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period
             WHERE a.state <> 'released' AND b.state <> 'released'
            """
        )
        return int(cursor.fetchone()[0])


def _check_invariants(changes: dict[int, int]) -> None:
    assert _overlapping_pairs() == 0
    for booking in Booking.objects.prefetch_related("allocations"):
        live = [a for a in booking.allocations.all() if a.state != Allocation.State.RELEASED]
        if booking.status in Booking.OPEN_STATUSES:
            assert len(live) == booking.gpu_count
            assert len({a.gpu_id for a in live}) == booking.gpu_count
            assert all(a.period.lower == booking.start_at and a.period.upper == booking.end_at for a in live)
        elif booking.status == Booking.Status.CANCELLED and booking.ended_at is None:
            assert live == []  # cancelled before its start: nothing blocks any more
        else:  # ended: history kept, truncated at the real end
            assert all(a.state == Allocation.State.ENDED and a.period.upper <= booking.ended_at for a in live)
        events = AuditEvent.objects.filter(entity_type="booking", entity_id=booking.pk).count()
        assert events == changes[booking.pk]


@given(operations=_operations)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_random_booking_operations_keep_the_invariants(member, project, a100, nodes, operations):
    base: datetime = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    with transaction.atomic():  # each example starts from the same fixtures and is rolled back
        created: list[Booking] = []
        changes: dict[int, int] = {}
        for kind, a, b, c in operations:
            try:
                if kind == "create":
                    start = base + b * SLOT
                    booking = booking_create(
                        member,
                        project=project,
                        gpu_type=a100,
                        gpu_count=a,
                        start_at=start,
                        end_at=start + c * SLOT,
                    )
                    created.append(booking)
                    changes[booking.pk] = 1
                elif not created:
                    continue
                else:
                    booking = created[a % len(created)]
                    booking.refresh_from_db()
                    if kind == "cancel":
                        booking_cancel(booking, user=member, now=base - SLOT)
                    elif kind == "extend":
                        booking_extend(
                            booking, user=member, end_at=booking.end_at + b * SLOT, now=base - SLOT
                        )
                    else:
                        booking_end_early(booking, user=member, now=booking.start_at + (b + 1) * SLOT / 2)
                    changes[booking.pk] += 1
                event(f"{kind} succeeded")
            except (BookingConflictError, ValidationError) as exc:
                event(f"{kind} refused: {type(exc).__name__}")  # and must have changed nothing
            _check_invariants(changes)
        transaction.set_rollback(True)
