"""Extending a booking: a later end on the same GPUs, refused with the latest end still free."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from scheduling.alternatives import Alternative
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
)
from scheduling.services.audit import (
    _booking_state,
    allocation_events_record,
    allocation_state,
    entity_event_record,
)
from scheduling.services.common import (
    BookingConflictError,
    _engine_round_soon,
    _human,
    _lock_booking,
    _lock_nodes,
    _now,
    _require_can_manage,
    _utc,
    is_exclusion_violation,
)
from scheduling.services.placement import (
    _check_booking_quota,
)


def _extension_limit(*, gpu_ids: Sequence[int], after: datetime, exclude_booking_id: int) -> datetime | None:
    """The earliest start of another blocking allocation on these GPUs at or after ``after``."""
    starts = (
        Allocation.objects.filter(gpu_id__in=gpu_ids, period__overlap=DateTimeTZRange(after, None, "[)"))
        .exclude(state=Allocation.State.RELEASED)
        .exclude(booking_id=exclude_booking_id)
        .values_list("period", flat=True)
    )
    lowers = [max(p.lower, after) for p in starts if p.lower is not None]
    return min(lowers, default=None)


def booking_require_extendable(booking: Booking, *, now: datetime | None = None) -> None:
    """Raise a ``status`` `ValidationError` that says why ``booking`` cannot be extended (it
    was cancelled, it is over, it failed); nothing when it is upcoming or running.  The API asks
    this before it parses the new end, so a cancelled booking is told so, not "end_at required"."""
    now = _now(now)
    if booking.status == Booking.Status.CANCELLED:
        raise ValidationError(
            {"status": "This booking was cancelled, so it cannot be extended. Book a new window instead."}
        )
    if booking.status not in Booking.OPEN_STATUSES or booking.end_at <= now:
        raise ValidationError(
            {"status": "This booking has already ended, so it cannot be extended. Book a new window instead."}
        )


def booking_extend(
    booking: Booking,
    *,
    user: User,
    end_at: datetime,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """Move an open booking's end later, on the same GPUs, atomically.

    Raises ``BookingConflictError`` when another allocation starts on one of its GPUs before
    the new end; its one alternative is the latest end that is still free.
    """
    now = _now(now)
    if timezone.is_naive(end_at):
        raise ValidationError({"end_at": "Give a timezone (for example 2026-01-31T09:00:00Z)."})
    with transaction.atomic():
        # Nodes before the booking row, the order the engine's reconcile takes them in
        # (nodes, jobs, bookings); a booking's type and cluster never change, so reading
        # them before the lock is safe.
        _lock_nodes(gpu_type=booking.gpu_type, cluster_ids=[booking.cluster_id])
        booking = _lock_booking(booking)
        _require_can_manage(user, owner_id=booking.user_id, project_id=booking.project_id)
        _extension_check(booking, end_at=end_at, now=now)
        allocations = list(booking.allocations.exclude(state=Allocation.State.RELEASED))
        gpu_ids = [a.gpu_id for a in allocations]
        limit = _extension_limit(gpu_ids=gpu_ids, after=booking.end_at, exclude_booking_id=booking.pk)
        changed = (
            _allocations_extend(allocations, end_at=end_at) if limit is None or limit >= end_at else None
        )
        if changed is not None:
            _extension_record(
                booking, changed=changed, user=user, actor_label=actor_label, end_at=end_at, now=now
            )
            return booking
    raise _extension_refusal(booking, limit=limit)


def _extension_check(booking: Booking, *, end_at: datetime, now: datetime) -> None:
    """Refuse (400) an end that is not later, too long, too far ahead or over the project's quota;
    under the caller's node and booking locks."""
    booking_require_extendable(booking, now=now)
    if end_at <= booking.end_at:
        raise ValidationError({"end_at": "The new end must be after the current end."})
    max_duration = timedelta(seconds=settings.BERTH_BOOKING_MAX_DURATION_S)
    if end_at - booking.start_at > max_duration:
        raise ValidationError({"end_at": f"A booking lasts at most {_human(max_duration)}."})
    if end_at > now + timedelta(seconds=settings.BERTH_BOOKING_MAX_ADVANCE_S):
        raise ValidationError({"end_at": "That is too far ahead."})
    _check_booking_quota(
        project=booking.project,
        gpu_type=booking.gpu_type,
        gpu_count=booking.gpu_count,
        start_at=booking.start_at,
        end_at=end_at,
        exclude_booking_id=booking.pk,
    )


def _allocations_extend(
    allocations: Sequence[Allocation], *, end_at: datetime
) -> list[tuple[Allocation, dict[str, Any]]] | None:
    """Move the allocations' ends to ``end_at`` (in a savepoint); ``None`` when the exclusion
    constraint refuses (a writer that skipped the node lock took a GPU meanwhile)."""
    changed = []
    for allocation in allocations:
        before = allocation_state(allocation)
        allocation.period = DateTimeTZRange(allocation.period.lower, end_at, "[)")
        changed.append((allocation, before))
    try:
        with transaction.atomic():
            Allocation.objects.bulk_update([a for a, _ in changed], ["period"])
    except IntegrityError as exc:
        if not is_exclusion_violation(exc):
            raise
        return None
    return changed


def _extension_record(
    booking: Booking,
    *,
    changed: Sequence[tuple[Allocation, dict[str, Any]]],
    user: User,
    actor_label: str,
    end_at: datetime,
    now: datetime,
) -> None:
    """Save the new end and audit the booking and each allocation it moved."""
    before_booking = _booking_state(booking)
    booking.end_at = end_at
    booking.save(update_fields=["end_at", "updated_at"])
    allocation_events_record(
        changes=changed, actor=user, actor_label=actor_label, verb="allocation.extend", at=now
    )
    entity_event_record(
        booking, verb="booking.extend", before=before_booking, actor=user, actor_label=actor_label, at=now
    )
    _engine_round_soon(booking.cluster_id)


def _extension_refusal(booking: Booking, *, limit: datetime | None) -> BookingConflictError:
    """The 409 for an end its GPUs cannot reach; the one alternative is the latest end still free."""
    alternatives: list[Alternative] = []
    if limit is not None and limit > booking.end_at:
        alternatives.append(
            Alternative(
                cluster=booking.cluster.name,
                gpu_type=booking.gpu_type.name,
                gpu_count=booking.gpu_count,
                start_at=booking.start_at,
                end_at=limit,
            )
        )
    return BookingConflictError(
        "Its GPUs are booked by someone else before the new end"
        + (f"; it can be extended until {_utc(limit)}." if limit is not None else "."),
        alternatives=alternatives,
        fields={"end_at": ["The GPUs are not free until then."]},
    )
