"""Every write to bookings, jobs and allocations, with an audit event for each state change.

Locking protocol (keep it when adding writers, e.g. the engine's plan persistence):

* a writer that places allocations locks the ``Node`` rows of the GPU type it places on,
  in id order, with ``select_for_update`` before reading what is free; concurrent bookings
  of the same type are then serialized instead of racing;
* a booking writer that needs both takes the nodes first, then the booking row: the
  engine's reconcile updates nodes and then locks bookings, so the reverse order could
  deadlock with it;
* the btree_gist exclusion constraint on ``Allocation`` stays the last line of defence for
  any writer that skipped the lock: an exclusion violation makes ``booking_create`` pick
  again (twice), then refuse with the nearest alternatives.

Services raise ``django.core.exceptions.ValidationError`` with field keys (400),
``PermissionDenied`` (403) when the user may not act on the project or object, and
``BookingConflictError`` (409) when the GPUs are taken.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg.errors
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from portal.accounts.models import Membership, Project, Quota
from scheduling import admission
from scheduling.alternatives import Alternative, booking_alternatives, peak_concurrent_gpus
from scheduling.models import (
    Allocation,
    AuditEvent,
    Booking,
    Cluster,
    Gpu,
    GpuType,
    Job,
    Node,
)
from scheduling.selectors import availability_write_noted, prepared_fetchall
from scheduling.snapshots import job_startability

logger = logging.getLogger(__name__)

# How many times booking_create picks GPUs again after the exclusion constraint refused its pick.
_PLACEMENT_ATTEMPTS = 3


class BookingConflictError(Exception):
    """The requested GPUs are not free; carries the nearest free alternative windows (409)."""

    def __init__(
        self,
        message: str,
        *,
        alternatives: Sequence[Alternative] = (),
        fields: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.alternatives = list(alternatives)
        self.fields = fields or {}


# ---- audit ----


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _booking_state(booking: Booking) -> dict[str, Any]:
    return {
        "status": booking.status,
        "start_at": _iso(booking.start_at),
        "end_at": _iso(booking.end_at),
        "ended_at": _iso(booking.ended_at),
        "gpu_count": booking.gpu_count,
    }


def _job_state(job: Job) -> dict[str, Any]:
    return {
        "status": job.status,
        "started_at": _iso(job.started_at),
        "ended_at": _iso(job.ended_at),
        "attempt": job.attempt,
    }


def allocation_state(allocation: Allocation) -> dict[str, Any]:
    period = allocation.period
    return {
        "gpu_id": allocation.gpu_id,
        "state": allocation.state,
        "lower": _iso(period.lower),
        "upper": _iso(period.upper),
        "is_preemptible": allocation.is_preemptible,
    }


def _actor_id(actor: User | None) -> int | None:
    return int(actor.pk) if actor is not None and actor.pk is not None else None


_AUDIT_BUFFER: ContextVar[list[AuditEvent] | None] = ContextVar("berth_audit_buffer", default=None)


@contextmanager
def audit_events_deferred() -> Iterator[None]:
    """Within the block, audit events are collected and written in one INSERT when it ends.

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
        AuditEvent.objects.bulk_create(buffer, batch_size=2_000)


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

    Inside `audit_events_deferred` the event is only collected (its ``pk`` stays None until the
    block writes it).
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


# ---- shared checks ----


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def _require_member(user: User, *, project: Project) -> None:
    """Members act for their project; staff may act for any project."""
    if getattr(user, "is_staff", False):
        return
    if not Membership.objects.filter(user_id=user.pk, project=project).exists():
        raise PermissionDenied("You are not a member of this project.")


def _require_member_read_quota(user: User, *, project: Project, gpu_type: GpuType) -> Quota | None:
    """``_require_member`` and the project's quota row for the type, in one round trip.

    The quota row is read before the caller's node lock (a quota created concurrently is
    indistinguishable from one created just after this booking); the project's peak use,
    which concurrent bookings do change, is computed under the lock.
    """
    [(is_member, quota_id, guaranteed, borrow)] = prepared_fetchall(
        f"""
        SELECT EXISTS (SELECT 1 FROM {Membership._meta.db_table} WHERE user_id = %s AND project_id = %s),
               q.id, q.guaranteed_gpus, q.borrow_limit_gpus
          FROM (SELECT 1) AS one
          LEFT JOIN {Quota._meta.db_table} q ON q.project_id = %s AND q.gpu_type_id = %s
        """,  # noqa: S608 - table names from the models, values bound
        [user.pk, project.pk, project.pk, gpu_type.pk],
    )
    if not getattr(user, "is_staff", False) and not is_member:
        raise PermissionDenied("You are not a member of this project.")
    if quota_id is None:
        return None
    return Quota(
        pk=quota_id, project=project, gpu_type=gpu_type, guaranteed_gpus=guaranteed, borrow_limit_gpus=borrow
    )


def _require_can_manage(user: User, *, owner_id: int, project_id: int) -> None:
    """The owner, a manager of the object's project, or staff may change it."""
    if getattr(user, "is_staff", False) or user.pk == owner_id:
        return
    is_manager = Membership.objects.filter(
        user_id=user.pk, project_id=project_id, role=Membership.Role.MANAGER
    ).exists()
    if not is_manager:
        raise PermissionDenied("Only the owner or a project manager may change this.")


def _validate_window(*, start_at: datetime, end_at: datetime, now: datetime) -> None:
    errors: dict[str, list[str]] = defaultdict(list)
    for name, value in (("start_at", start_at), ("end_at", end_at)):
        if timezone.is_naive(value):
            errors[name].append("Give a timezone (for example 2026-01-31T09:00:00Z).")
    if errors:
        raise ValidationError(dict(errors))
    min_duration = timedelta(seconds=settings.BERTH_BOOKING_MIN_DURATION_S)
    if end_at <= start_at:
        errors["end_at"].append("The end must be after the start.")
    elif end_at - start_at < min_duration:
        errors["end_at"].append(
            f"A booking lasts at least {int(min_duration.total_seconds() // 60)} minutes."
        )
    if start_at < now - timedelta(seconds=settings.BERTH_BOOKING_PAST_TOLERANCE_S):
        errors["start_at"].append("The start is in the past.")
    max_advance = timedelta(seconds=settings.BERTH_BOOKING_MAX_ADVANCE_S)
    if start_at > now + max_advance:
        errors["start_at"].append(f"Bookings open at most {max_advance.days} days ahead.")
    max_duration = timedelta(seconds=settings.BERTH_BOOKING_MAX_DURATION_S)
    if end_at - start_at > max_duration:
        errors["end_at"].append(f"A booking lasts at most {_human(max_duration)}.")
    if errors:
        raise ValidationError(dict(errors))


def _utc(value: datetime) -> str:
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def _human(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:g} days" if hours >= 48 else f"{hours:g} hours"


def _is_exclusion_violation(exc: IntegrityError) -> bool:
    return isinstance(exc.__cause__, psycopg.errors.ExclusionViolation)


def _is_deadlock(exc: OperationalError) -> bool:
    # Two writers that skip the node lock can wait on each other's exclusion-index entries.
    return isinstance(exc.__cause__, psycopg.errors.DeadlockDetected)


def _lock_nodes(*, gpu_type: GpuType, cluster_ids: Sequence[int]) -> None:
    """Serialize placements on one GPU type (see the locking protocol in the module docstring)."""
    prepared_fetchall(
        f"SELECT id FROM {Node._meta.db_table} WHERE gpu_type_id = %s AND cluster_id = ANY(%s)"  # noqa: S608
        " ORDER BY id FOR UPDATE",
        [gpu_type.pk, list(cluster_ids)],
    )


# ---- booking placement ----


_FreeNode = admission.FreeNode  # the rule set is pure: scheduling.admission


# GPUs of the type on up nodes with no blocking allocation overlapping the period, one row per
# node with its free GPUs' ids and indexes as arrays (in index order).  Raw SQL: it runs under
# the node lock of every booking, and the ORM's compilation of the NOT EXISTS cost more CPU
# than PostgreSQL's answer; one row per node rather than per GPU saves converting and
# regrouping every GPU in Python.  ``NOT (state = 'released')`` is the exclusion index's
# predicate, so the index serves the anti-join.
_FREE_GPUS_SQL = f"""
SELECT n.id, n.name, n.cluster_id, array_agg(g.id ORDER BY g.index), array_agg(g.index ORDER BY g.index)
  FROM {Gpu._meta.db_table} g
  JOIN {Node._meta.db_table} n ON n.id = g.node_id
 WHERE n.gpu_type_id = %(gpu_type)s AND n.cluster_id = ANY(%(clusters)s) AND n.status = %(up)s
   AND NOT EXISTS (
       SELECT 1 FROM {Allocation._meta.db_table} a
        WHERE a.gpu_id = g.id AND a.period && %(period)s AND NOT (a.state = %(released)s)
   )
 GROUP BY n.id
 ORDER BY n.id
"""  # noqa: S608 - table names from the models, values bound


def _free_nodes(*, gpu_type: GpuType, cluster_ids: Sequence[int], period: DateTimeTZRange) -> list[_FreeNode]:
    """GPUs of the type on up nodes with no blocking allocation overlapping ``period``."""
    rows = prepared_fetchall(
        _FREE_GPUS_SQL,
        {
            "gpu_type": gpu_type.pk,
            "clusters": list(cluster_ids),
            "up": Node.Status.UP.value,
            "period": period,
            "released": Allocation.State.RELEASED.value,
        },
    )
    return [
        _FreeNode(node_id, name, cluster_id, tuple(gpu_ids), tuple(indexes))
        for node_id, name, cluster_id, gpu_ids, indexes in rows
    ]


# A booking, its allocations and its audit events (the booking's, then one per allocation in
# GPU order) in one prepared statement: through the ORM these were three INSERTs whose
# compilation cost more CPU than anything else in booking_create.  The allocations reference
# the booking inserted by the same statement (foreign keys are checked at its end).  The
# allocation events' ``after`` is ``allocation_state`` of each new allocation, built in Python.
_BOOKING_INSERT_AUDITED_SQL = f"""
WITH booking AS (
    INSERT INTO {Booking._meta.db_table}
           (user_id, project_id, cluster_id, gpu_type_id, gpu_count, start_at, end_at, status, note,
            created_at, updated_at, ended_at, is_in_use, status_message)
    VALUES (%(user)s::bigint, %(project)s::bigint, %(cluster)s::bigint, %(gpu_type)s::bigint,
            %(gpu_count)s::smallint, %(start_at)s::timestamptz, %(end_at)s::timestamptz,
            %(status)s::varchar, %(note)s::varchar, %(created_at)s::timestamptz,
            %(created_at)s::timestamptz, NULL, false, '')
    RETURNING id
),
alloc AS (
    INSERT INTO {Allocation._meta.db_table}
           (gpu_id, booking_id, job_id, period, is_preemptible, state, created_at)
    SELECT u.gpu, booking.id, NULL, %(period)s::tstzrange, false, %(state)s::varchar, %(at)s::timestamptz
      FROM booking, unnest(%(gpus)s::bigint[]) WITH ORDINALITY AS u(gpu, ord)
     ORDER BY u.ord
    RETURNING id, gpu_id
),
events AS (
    SELECT 0::bigint AS ord, booking.id AS entity_id, 'booking' AS entity_type,
           'booking.create' AS verb, %(booking_after)s::jsonb AS after
      FROM booking
    UNION ALL
    SELECT a.ord, alloc.id, 'allocation', 'allocation.create', a.after
      FROM alloc JOIN unnest(%(gpus)s::bigint[], %(afters)s::jsonb[]) WITH ORDINALITY AS a(gpu, after, ord)
        ON a.gpu = alloc.gpu_id
),
audited AS (
    INSERT INTO {AuditEvent._meta.db_table}
           (actor_id, actor_label, verb, entity_type, entity_id, before, after, at)
    SELECT %(actor)s::bigint, %(label)s::varchar, verb, entity_type, entity_id, NULL, after,
           %(at)s::timestamptz
      FROM events ORDER BY ord
)
SELECT id FROM booking
"""  # noqa: S608 - table names from the models, values bound


def _booking_insert_audited(
    *,
    booking: Booking,
    gpu_ids: Sequence[int],
    period: DateTimeTZRange,
    actor: User,
    actor_label: str,
    booking_after: dict[str, Any],
    at: datetime,
) -> None:
    """Insert the unsaved ``booking`` (setting its id and timestamps, as ``save()`` would) and
    its planned allocations, and write ``booking.create`` and one ``allocation.create`` event per
    allocation, as ``allocation_events_record`` would."""
    state = Allocation.State.PLANNED.value
    afters = [
        json.dumps(
            {
                "gpu_id": g,
                "state": state,
                "lower": _iso(period.lower),
                "upper": _iso(period.upper),
                "is_preemptible": False,
            }
        )
        for g in gpu_ids
    ]
    created_at = timezone.now()  # what auto_now_add / auto_now would set
    # ``prepared_execute`` (server-side binding, planned once per connection), reading back the id.
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            _BOOKING_INSERT_AUDITED_SQL,
            {
                "user": booking.user_id,
                "project": booking.project_id,
                "cluster": booking.cluster_id,
                "gpu_type": booking.gpu_type_id,
                "gpu_count": booking.gpu_count,
                "start_at": booking.start_at,
                "end_at": booking.end_at,
                "status": str(booking.status),
                "note": booking.note,
                "created_at": created_at,
                "period": period,
                "state": state,
                "at": at,
                "gpus": list(gpu_ids),
                "booking_after": json.dumps(booking_after),
                "afters": afters,
                "actor": _actor_id(actor),
                "label": str(actor_label),
            },
            prepare=True,
        )
        [(booking_id,)] = cursor.fetchall()
    booking.pk = booking_id
    booking.created_at = booking.updated_at = created_at
    booking._state.adding = False
    booking._state.db = connection.alias
    availability_write_noted()


_pick_gpus = admission.pick_gpus


def _capacity_by_cluster(*, gpu_type: GpuType, cluster_ids: Sequence[int]) -> dict[int, int]:
    """GPUs of the type per cluster (one grouped row per cluster, not one row per GPU)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n.cluster_id, count(*) FROM {Gpu._meta.db_table} g"  # noqa: S608
            f" JOIN {Node._meta.db_table} n ON n.id = g.node_id"
            " WHERE n.gpu_type_id = %s AND n.cluster_id = ANY(%s) GROUP BY n.cluster_id",
            [gpu_type.pk, list(cluster_ids)],
        )
        return {cluster_id: int(n) for cluster_id, n in cursor.fetchall()}


_QUOTA_UNREAD = object()


def _check_booking_quota(
    *,
    project: Project,
    gpu_type: GpuType,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    exclude_booking_id: int | None = None,
    quota: Any = _QUOTA_UNREAD,
) -> None:
    """Refuse (400) what would take the project over its quota of the type in the window.

    ``quota``: the project's ``Quota`` row for the type (or ``None``) when the caller has read it
    already; the peak is always computed here, under the caller's node lock.
    """
    if quota is _QUOTA_UNREAD:
        quota = Quota.objects.filter(project=project, gpu_type=gpu_type).first()
    if quota is None or quota.max_gpus is None:
        return
    peak = peak_concurrent_gpus(
        project=project,
        gpu_type=gpu_type,
        start_at=start_at,
        end_at=end_at,
        exclude_booking_id=exclude_booking_id,
    )
    message = admission.booking_cap_error(
        project=project.slug, gpu_type=gpu_type.name, max_gpus=quota.max_gpus, peak=peak, gpu_count=gpu_count
    )
    if message is not None:
        raise ValidationError({"gpu_count": message})


def booking_create(
    user: User,
    *,
    project: Project,
    gpu_type: GpuType,
    gpu_count: int,
    start_at: datetime,
    end_at: datetime,
    cluster: Cluster | None = None,
    note: str = "",
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """Book ``gpu_count`` GPUs of ``gpu_type`` over ``[start_at, end_at)`` on concrete GPUs.

    Picks free GPUs on one node when the count fits one node (best fit), else across as few
    nodes of one cluster as possible, and inserts one allocation per GPU.  Raises
    ``ValidationError`` for bad input, ``PermissionDenied`` for a project the user is not in
    and ``BookingConflictError`` (with the nearest free windows) when the GPUs are taken.
    Nothing is written unless the whole booking succeeds.
    """
    now = _now(now)
    _validate_window(start_at=start_at, end_at=end_at, now=now)
    if gpu_count < 1:
        raise ValidationError({"gpu_count": "Book at least one GPU."})
    quota = _require_member_read_quota(user, project=project, gpu_type=gpu_type)
    if not project.is_active:
        raise ValidationError({"project": "This project is archived."})

    clusters = [cluster] if cluster is not None else list(Cluster.objects.filter(is_active=True))
    if cluster is not None and not cluster.is_active:
        raise ValidationError({"cluster": "This cluster is not active."})
    cluster_ids = [c.pk for c in clusters]
    # A count no cluster has is a 400, not a 409; checked only when placement fails, so a
    # booking that fits costs no capacity query.

    period = DateTimeTZRange(start_at, end_at, "[)")
    for attempt in range(_PLACEMENT_ATTEMPTS):
        try:
            with transaction.atomic():
                _lock_nodes(gpu_type=gpu_type, cluster_ids=cluster_ids)
                # Under the node lock: two bookings of one project cannot both pass the quota.
                _check_booking_quota(
                    project=project,
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    start_at=start_at,
                    end_at=end_at,
                    quota=quota,
                )
                free = _free_nodes(gpu_type=gpu_type, cluster_ids=cluster_ids, period=period)
                pick = _pick_gpus(free, gpu_count=gpu_count)
                if pick is None:
                    break
                gpu_ids, cluster_id = pick
                booking = Booking(
                    user=user,
                    project=project,
                    cluster_id=cluster_id,
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    start_at=start_at,
                    end_at=end_at,
                    note=note,
                    status=Booking.Status.CONFIRMED,
                )
                _booking_insert_audited(
                    booking=booking,
                    gpu_ids=gpu_ids,
                    period=period,
                    actor=user,
                    actor_label=actor_label,
                    booking_after={
                        **_booking_state(booking),
                        "gpu_ids": list(gpu_ids),
                        "cluster_id": cluster_id,
                    },
                    at=now,
                )
                _engine_round_soon(cluster_id)
                # What the API shows, without reading the booking back: its cluster and GPUs.
                booking.cluster = next(c for c in clusters if c.pk == cluster_id)
                where = {
                    g: (node.name, i)
                    for node in free
                    for g, i in zip(node.gpu_ids, node.gpu_indexes, strict=True)
                }
                booking.held_gpus = [(g, *where[g]) for g in sorted(gpu_ids)]  # type: ignore[attr-defined]
                return booking
        except (IntegrityError, OperationalError) as exc:
            is_retryable = (
                _is_exclusion_violation(exc) if isinstance(exc, IntegrityError) else _is_deadlock(exc)
            )
            if not is_retryable:
                raise
            # Another writer (one that skipped the node lock) took a GPU between our read
            # and our insert: read again and pick other GPUs.
            logger.info(
                "booking_create: %s on attempt %d; picking again", type(exc.__cause__).__name__, attempt + 1
            )

    capacity = _capacity_by_cluster(gpu_type=gpu_type, cluster_ids=cluster_ids)
    largest = max(capacity.values(), default=0)
    if largest == 0:
        raise ValidationError({"gpu_type": f"No cluster here has {gpu_type.name} GPUs."})
    if gpu_count > largest:
        raise ValidationError(
            {
                "gpu_count": (
                    f"At most {largest} {gpu_type.name} GPUs exist in one cluster; asked for {gpu_count}."
                )
            }
        )
    alternatives = booking_alternatives(
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        start_at=start_at,
        end_at=end_at,
        cluster_ids=cluster_ids,
    )
    raise BookingConflictError(
        f"{gpu_count} {gpu_type.name} GPU(s) are not free from {_utc(start_at)} to {_utc(end_at)}.",
        alternatives=alternatives,
        fields={"start_at": ["Not enough free GPUs in this window."]},
    )


def _engine_round_soon(cluster_id: int) -> None:
    """Ask for an engine round after the commit (debounced); a missed trigger waits for beat."""
    from scheduling.tasks import engine_round_trigger  # lazy: tasks -> rounds -> services

    engine_round_trigger(cluster_id)


def _runtime_predict_soon(job_id: int) -> None:
    """Store the job's predicted runtime after the commit, off the request path."""

    def enqueue() -> None:
        from forecasting.tasks import job_runtime_predict

        try:
            job_runtime_predict.delay(job_id)
        except Exception:  # the hourly refresh fills predictions that a broker outage missed
            logger.warning("could not enqueue a runtime prediction for job %s", job_id, exc_info=True)

    transaction.on_commit(enqueue)


def _lock_booking(booking: Booking) -> Booking:
    return Booking.objects.select_for_update().get(pk=booking.pk)


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


def _lock_open_booking(booking: Booking, *, user: User) -> Booking:
    booking = _lock_booking(booking)
    _require_can_manage(user, owner_id=booking.user_id, project_id=booking.project_id)
    if booking.status not in Booking.OPEN_STATUSES:
        raise ValidationError({"status": f"This booking is already {booking.status}."})
    return booking


def _booking_close(
    booking: Booking,
    *,
    status: str,
    ended_at: datetime | None,
    user: User,
    actor_label: str,
    verb: str,
    allocation_verb: str,
    now: datetime,
) -> Booking:
    """Set the booking's final status, end its allocations at ``now`` and audit both."""
    before = _booking_state(booking)
    booking.status = status
    booking.ended_at = ended_at
    booking.save(update_fields=["status", "ended_at", "updated_at"])
    allocations_close(
        booking.allocations.all(), at=now, actor=user, actor_label=actor_label, verb=allocation_verb
    )
    audit_event_record(
        actor=user,
        actor_label=actor_label,
        verb=verb,
        entity_type="booking",
        entity_id=booking.pk,
        before=before,
        after=_booking_state(booking),
        at=now,
    )
    _engine_round_soon(booking.cluster_id)
    return booking


@transaction.atomic
def booking_cancel(
    booking: Booking,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """Cancel an open booking.

    Before its start, its allocations are released (they stop blocking at once).  After its
    start, it ends now: allocations are truncated to ``[start, now)`` and kept as history.
    """
    now = _now(now)
    booking = _lock_open_booking(booking, user=user)
    return _booking_close(
        booking,
        status=Booking.Status.CANCELLED,
        ended_at=now if booking.start_at < now else booking.ended_at,
        user=user,
        actor_label=actor_label,
        verb="booking.cancel",
        allocation_verb="allocation.cancel",
        now=now,
    )


@transaction.atomic
def booking_end_early(
    booking: Booking,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Booking:
    """End a running booking now; its GPUs are free again from now on.

    Only for a booking that has started and not yet ended (use ``booking_cancel`` before the start).
    """
    now = _now(now)
    booking = _lock_open_booking(booking, user=user)
    if now <= booking.start_at:
        raise ValidationError({"status": "This booking has not started yet; cancel it instead."})
    if now >= booking.end_at:
        raise ValidationError({"status": "This booking has already ended."})
    return _booking_close(
        booking,
        status=Booking.Status.COMPLETED,
        ended_at=now,
        user=user,
        actor_label=actor_label,
        verb="booking.end_early",
        allocation_verb="allocation.end",
        now=now,
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
        allocations = list(booking.allocations.exclude(state=Allocation.State.RELEASED))
        gpu_ids = [a.gpu_id for a in allocations]
        limit = _extension_limit(gpu_ids=gpu_ids, after=booking.end_at, exclude_booking_id=booking.pk)
        conflict = limit is not None and limit < end_at
        if not conflict:
            changed = []
            for allocation in allocations:
                before = allocation_state(allocation)
                allocation.period = DateTimeTZRange(allocation.period.lower, end_at, "[)")
                changed.append((allocation, before))
            try:
                with transaction.atomic():
                    Allocation.objects.bulk_update([a for a, _ in changed], ["period"])
            except IntegrityError as exc:
                if not _is_exclusion_violation(exc):
                    raise
                conflict = True
        if not conflict:
            before_booking = _booking_state(booking)
            booking.end_at = end_at
            booking.save(update_fields=["end_at", "updated_at"])
            allocation_events_record(
                changes=changed, actor=user, actor_label=actor_label, verb="allocation.extend", at=now
            )
            audit_event_record(
                actor=user,
                actor_label=actor_label,
                verb="booking.extend",
                entity_type="booking",
                entity_id=booking.pk,
                before=before_booking,
                after=_booking_state(booking),
                at=now,
            )
            _engine_round_soon(booking.cluster_id)
            return booking
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
    raise BookingConflictError(
        "Its GPUs are booked by someone else before the new end"
        + (f"; it can be extended until {_utc(limit)}." if limit is not None else "."),
        alternatives=alternatives,
        fields={"end_at": ["The GPUs are not free until then."]},
    )


# ---- jobs ----


def _job_candidate_types(
    *, gpu_type: GpuType | None, min_memory_gib: float, precisions: Sequence[str]
) -> list[GpuType]:
    types = [gpu_type] if gpu_type is not None else list(GpuType.objects.all())
    wanted = set(precisions)
    return [t for t in types if t.memory_gib >= min_memory_gib and wanted <= set(t.precisions)]


def _check_pending_limits(*, user: User, project: Project) -> None:
    """At most ``BERTH_MAX_PENDING_JOBS_PER_USER`` pending jobs per user and
    ``BERTH_MAX_PENDING_JOBS_PER_PROJECT`` per project (0: no limit): every pending job costs
    every engine round work, so a script cannot queue without bound.  Two indexed counts; two
    racing submits may pass one over the limit (the bound, not the exact count, is the point)."""
    per_user = settings.BERTH_MAX_PENDING_JOBS_PER_USER
    per_project = settings.BERTH_MAX_PENDING_JOBS_PER_PROJECT
    pending = Job.objects.filter(status=Job.Status.PENDING)
    if per_user and pending.filter(user_id=user.pk).count() >= per_user:
        raise ValidationError(
            {
                "non_field_errors": f"You have {per_user} pending jobs, the most one user may queue; "
                "wait for some to start or cancel some."
            }
        )
    if per_project and pending.filter(project_id=project.pk).count() >= per_project:
        raise ValidationError(
            {
                "project": (
                    f"Project {project.slug} has {per_project} pending jobs, the most one project may queue."
                )
            }
        )


def job_submit(
    user: User,
    *,
    project: Project,
    name: str,
    gpu_count: int,
    cluster: Cluster | None = None,
    gpu_type: GpuType | None = None,
    kind: str = Job.Kind.BATCH,
    min_memory_gib: float = 0.0,
    precisions: Sequence[str] = (),
    requested_s: int | None = None,
    is_preemptible: bool = False,
    is_checkpointable: bool = False,
    checkpoint_interval_s: int | None = None,
    priority: int = Job.Priority.NORMAL,
    payload: dict[str, Any] | None = None,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Job:
    """Queue a job; the engine places it in a later round and explains why it waits.

    Checks that some GPU type in the cluster satisfies the type, memory and precision
    constraints with at least ``gpu_count`` GPUs (else the job could never run).  A job that
    the project's quota never lets start (`engine.startability`) is accepted, since quotas
    change, with that reason and what would unblock it as its pending sentence and no ETA;
    `selectors.job_warnings` gives the warning to show.
    """
    now = _now(now)
    errors: dict[str, list[str]] = defaultdict(list)
    if not name.strip():
        errors["name"].append("Give the job a name.")
    if gpu_count < 1:
        errors["gpu_count"].append("A job needs at least one GPU.")
    if min_memory_gib < 0:
        errors["min_memory_gib"].append("Cannot be negative.")
    if requested_s is not None and not 0 < requested_s <= settings.BERTH_JOB_MAX_REQUESTED_S:
        errors["requested_s"].append(
            f"Give a runtime estimate between 1 s and {settings.BERTH_JOB_MAX_REQUESTED_S} s."
        )
    if checkpoint_interval_s is not None and (not is_checkpointable or checkpoint_interval_s <= 0):
        errors["checkpoint_interval_s"].append(
            "Only a checkpointable job has a (positive) checkpoint interval."
        )
    if kind not in Job.Kind.values:
        errors["kind"].append(f"Unknown kind {kind!r}.")
    if priority not in Job.Priority.values:
        errors["priority"].append(f"Unknown priority {priority!r}.")
    if errors:
        raise ValidationError(dict(errors))
    _require_member(user, project=project)
    if not project.is_active:
        raise ValidationError({"project": "This project is archived."})
    _check_pending_limits(user=user, project=project)

    types = _job_candidate_types(gpu_type=gpu_type, min_memory_gib=min_memory_gib, precisions=precisions)
    if not types:
        raise ValidationError({"gpu_type": "No GPU type satisfies the memory and precision constraints."})
    clusters = [cluster] if cluster is not None else list(Cluster.objects.filter(is_active=True))
    best: tuple[int, Cluster] | None = None
    for candidate in clusters:
        for gt in types:
            capacity = _capacity_by_cluster(gpu_type=gt, cluster_ids=[candidate.pk]).get(candidate.pk, 0)
            if best is None or capacity > best[0]:
                best = (capacity, candidate)
    if best is None or best[0] == 0:
        raise ValidationError({"gpu_type": "No cluster here has a GPU that satisfies the constraints."})
    if gpu_count > best[0]:
        raise ValidationError({"gpu_count": f"At most {best[0]} fitting GPUs exist in one cluster."})

    with transaction.atomic():
        job = Job.objects.create(
            user=user,
            project=project,
            cluster=best[1],
            name=name.strip(),
            kind=kind,
            gpu_count=gpu_count,
            gpu_type=gpu_type,
            min_memory_gib=min_memory_gib,
            precisions=sorted(set(precisions)),
            requested_s=requested_s,
            is_preemptible=is_preemptible,
            is_checkpointable=is_checkpointable,
            checkpoint_interval_s=checkpoint_interval_s,
            priority=priority,
            payload=payload or {},
            status=Job.Status.PENDING,
            submitted_at=now,
            first_submitted_at=now,
            pending_sentence="Waiting for the next scheduling round.",
        )
        never = job_startability(job)
        if never is not None:
            # accepted (quotas and inventory change), but told at once why waiting will not help
            job.pending_reason = never.reason.value
            job.pending_sentence = never.message[:500]
            job.save(update_fields=["pending_reason", "pending_sentence"])
        audit_event_record(
            actor=user,
            actor_label=actor_label,
            verb="job.submit",
            entity_type="job",
            entity_id=job.pk,
            before=None,
            after=_job_state(job),
            at=now,
        )
        _runtime_predict_soon(job.pk)
        _engine_round_soon(job.cluster_id)
    return job


@transaction.atomic
def job_cancel(
    job: Job,
    *,
    user: User,
    actor_label: str = AuditEvent.Actor.USER,
    now: datetime | None = None,
) -> Job:
    """Cancel a pending or running job; its GPUs are free from now on.

    The backend stops a running job in the next engine round (it sees the job cancelled
    with a ``backend_ref`` still running), so no backend call happens inside this transaction.
    """
    now = _now(now)
    job = Job.objects.select_for_update().get(pk=job.pk)
    _require_can_manage(user, owner_id=job.user_id, project_id=job.project_id)
    if job.status not in Job.OPEN_STATUSES:
        raise ValidationError({"status": f"This job is already {job.status}."})
    before = _job_state(job)
    job.status = Job.Status.CANCELLED
    job.ended_at = now
    job.pending_reason = Job.PendingReason.NONE
    job.pending_sentence = ""
    job.eta_p50_at = job.eta_p90_at = None
    job.save(
        update_fields=["status", "ended_at", "pending_reason", "pending_sentence", "eta_p50_at", "eta_p90_at"]
    )
    allocations_close(
        job.allocations.all(), at=now, actor=user, actor_label=actor_label, verb="allocation.cancel"
    )
    audit_event_record(
        actor=user,
        actor_label=actor_label,
        verb="job.cancel",
        entity_type="job",
        entity_id=job.pk,
        before=before,
        after=_job_state(job),
        at=now,
    )
    _engine_round_soon(job.cluster_id)
    return job


# ---- inventory ----


def node_gpus_sync(node: Node) -> tuple[int, int]:
    """Make the node's ``Gpu`` rows match ``gpu_count`` (indexes ``0 .. gpu_count-1``).

    Adds missing GPUs and deletes surplus ones that were never allocated.  Refuses (field
    error on ``gpu_count``) to drop a GPU with allocation history: that history must stay.
    Returns ``(added, removed)``.
    """
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        surplus = Gpu.objects.filter(node=node, index__gte=node.gpu_count)
        if surplus.filter(allocations__isnull=False).exists():
            raise ValidationError(
                {"gpu_count": "GPUs above this count have allocations (history or future); keep them."}
            )
        removed, _ = surplus.delete()
        have = set(Gpu.objects.filter(node=node).values_list("index", flat=True))
        added = Gpu.objects.bulk_create(
            Gpu(node=node, index=i) for i in range(node.gpu_count) if i not in have
        )
        return len(added), removed


def node_create(
    *,
    cluster: Cluster,
    name: str,
    gpu_type: GpuType,
    gpu_count: int,
    status: str = Node.Status.UP,
    domain: str = "",
) -> Node:
    """Add a node and its GPU rows (the GPUs are what bookings and jobs are placed on)."""
    if gpu_count < 1:
        raise ValidationError({"gpu_count": "A node has at least one GPU."})
    if status not in Node.Status.values:
        raise ValidationError({"status": f"Unknown status {status!r}."})
    with transaction.atomic():
        if Node.objects.filter(cluster=cluster, name=name).exists():
            raise ValidationError({"name": f"{cluster.name} already has a node {name!r}."})
        node = Node.objects.create(
            cluster=cluster, name=name, gpu_type=gpu_type, gpu_count=gpu_count, status=status, domain=domain
        )
        node_gpus_sync(node)
        return node
