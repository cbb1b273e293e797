"""State snapshots and audit events: every writer records its changes through here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Job,
)
from scheduling.queries import audit_events_insert


def iso_or_none(value: datetime | None) -> str | None:
    """An audit state's time: ISO 8601 with its UTC offset, or None."""
    return value.isoformat() if value is not None else None


def _booking_state(booking: Booking) -> dict[str, Any]:
    return {
        "status": booking.status,
        "start_at": iso_or_none(booking.start_at),
        "end_at": iso_or_none(booking.end_at),
        "ended_at": iso_or_none(booking.ended_at),
        "gpu_count": booking.gpu_count,
    }


def job_state(job: Job) -> dict[str, Any]:
    """A job's audited state (``before``/``after`` of its events), for every writer: the services
    and the engine round alike, so a job's history reads the same whoever changed it."""
    return {
        "status": job.status,
        "started_at": iso_or_none(job.started_at),
        "ended_at": iso_or_none(job.ended_at),
        "attempt": job.attempt,
        "pending_reason": job.pending_reason,
    }


def allocation_state(allocation: Allocation) -> dict[str, Any]:
    period = allocation.period
    return {
        "gpu_id": allocation.gpu_id,
        "state": allocation.state,
        "lower": iso_or_none(period.lower),
        "upper": iso_or_none(period.upper),
        "is_preemptible": allocation.is_preemptible,
    }


def _actor_id(actor: User | None) -> int | None:
    return int(actor.pk) if actor is not None and actor.pk is not None else None


_AUDIT_BUFFER: ContextVar[list[AuditEvent] | None] = ContextVar("berth_audit_buffer", default=None)


@contextmanager
def audit_events_deferred() -> Iterator[None]:
    """Within the block, audit events are collected and written in one INSERT when it ends
    (`queries.audit_events_insert`, array literals: not ``bulk_create``, whose list parameters
    psycopg quotes element by element).

    For callers that write many events in one transaction (an engine round): use it inside the
    ``transaction.atomic()`` block, so the events commit with the changes they describe.  If
    the block raises, nothing is written (the transaction rolls back anyway).  Events recorded
    inside a savepoint that is rolled back would still be written: record them after it.
    """
    if _AUDIT_BUFFER.get() is not None:  # already deferring: the outer block writes them
        yield
        return
    buffer: list[AuditEvent] = []
    token = _AUDIT_BUFFER.set(buffer)
    try:
        yield
    finally:
        _AUDIT_BUFFER.reset(token)
    if buffer:
        audit_events_insert(buffer)


def audit_event_record(
    *,
    actor: User | None,
    actor_label: str,
    verb: str,
    entity_type: str,
    entity_id: int,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    at: datetime,
) -> AuditEvent:
    """Write one audit event; call it inside the transaction that makes the change.

    Inside `audit_events_deferred` the event is only collected (its ``pk`` stays None: the block
    writes the collected events in one statement, `queries.audit_events_insert`).
    """
    event = AuditEvent(
        actor_id=_actor_id(actor),
        actor_label=actor_label,
        verb=verb,
        entity_type=entity_type,
        entity_id=entity_id,
        before=before,
        after=after,
        at=at,
    )
    buffer = _AUDIT_BUFFER.get()
    if buffer is not None:
        buffer.append(event)
    else:
        event.save(force_insert=True)
    return event


def entity_event_record(
    entity: Booking | Job,
    *,
    verb: str,
    before: dict[str, Any] | None,
    actor: User | None,
    actor_label: str,
    at: datetime,
) -> AuditEvent:
    """`audit_event_record` for a booking or a job: ``after`` is its state now."""
    if isinstance(entity, Booking):
        entity_type, after = "booking", _booking_state(entity)
    else:
        entity_type, after = "job", job_state(entity)
    return audit_event_record(
        actor=actor,
        actor_label=actor_label,
        verb=verb,
        entity_type=entity_type,
        entity_id=entity.pk,
        before=before,
        after=after,
        at=at,
    )


def _allocation_events(
    *,
    changes: Iterable[tuple[Allocation, dict[str, Any] | None]],
    actor: User | None,
    actor_label: str,
    verb: str,
    at: datetime,
) -> list[AuditEvent]:
    return [
        AuditEvent(
            actor_id=_actor_id(actor),
            actor_label=actor_label,
            verb=verb,
            entity_type="allocation",
            entity_id=allocation.pk,
            before=before,
            after=allocation_state(allocation),
            at=at,
        )
        for allocation, before in changes
    ]


def allocation_events_record(
    *,
    changes: Iterable[tuple[Allocation, dict[str, Any] | None]],
    actor: User | None,
    actor_label: str,
    verb: str,
    at: datetime,
) -> None:
    """One audit event per changed allocation, in one INSERT (collected inside `audit_events_deferred`)."""
    events = _allocation_events(changes=changes, actor=actor, actor_label=actor_label, verb=verb, at=at)
    buffer = _AUDIT_BUFFER.get()
    if buffer is not None:
        buffer.extend(events)
    elif events:
        AuditEvent.objects.bulk_create(events)


def allocations_close(
    allocations: Iterable[Allocation],
    *,
    at: datetime,
    actor: User | None,
    actor_label: str,
    verb: str,
) -> None:
    """End blocking allocations at ``at``: truncate what had started, release what had not."""
    changed: list[tuple[Allocation, dict[str, Any]]] = []
    for allocation in allocations:
        if allocation.state in (Allocation.State.RELEASED, Allocation.State.ENDED):
            continue
        before = allocation_state(allocation)
        lower, upper = allocation.period.lower, allocation.period.upper
        if lower is not None and lower < at:
            if upper is None or upper > at:
                allocation.period = DateTimeTZRange(lower, at, "[)")
            allocation.state = Allocation.State.ENDED
        else:
            allocation.state = Allocation.State.RELEASED
        changed.append((allocation, before))
    if changed:
        Allocation.objects.bulk_update([a for a, _ in changed], ["period", "state"])
        allocation_events_record(changes=changed, actor=actor, actor_label=actor_label, verb=verb, at=at)
